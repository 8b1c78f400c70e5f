#pragma once
/// The typed overloads of every collective (pointer + count, and std::span), written once and
/// inherited by both communicators, so the two backends offer the same overload set with the
/// same defaults. Each overload builds `TensorView`s in the backend's memory kind and calls the
/// backend's type-erased collective of the same name; argument checks and errors are the
/// backend's. A backend uses it as
///
///     class Communicator : public ncclkit::detail::TypedCollectives<Communicator, StreamArg> {
///       using Typed = ncclkit::detail::TypedCollectives<Communicator, StreamArg>;
///      public:
///       using Typed::all_reduce;  // ...one using-declaration per collective
///       void all_reduce(TensorView in, TensorView out, ReduceOp op = ReduceOp::kSum, StreamArg s = {});
///     };
///
/// Counts follow NCCL's convention: all_gather, gather and all_to_all take the count each rank
/// contributes (out holds size() times as many), reduce_scatter and scatter the count each
/// rank receives (in holds size() times as many).

#include <cstddef>      // std::size_t
#include <span>         // std::span
#include <type_traits>  // std::type_identity_t, std::remove_const_t

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/tensor.hpp"

namespace ncclkit::detail {

template <class Derived, class StreamParam>
class TypedCollectives {
 public:
  // ---- pointer + count ---------------------------------------------------------------------------

  template <class T>
  void all_reduce(const T* in, T* out, std::size_t count, ReduceOp op = ReduceOp::kSum, StreamParam stream = {}) {
    self().all_reduce(view(in, count), view(out, count), op, stream);
  }
  /// In place.
  template <class T>
  void all_reduce(T* data, std::size_t count, ReduceOp op = ReduceOp::kSum, StreamParam stream = {}) {
    self().all_reduce(view(data, count), view(data, count), op, stream);
  }
  template <class T>
  void broadcast(const T* in, T* out, std::size_t count, int root, StreamParam stream = {}) {
    self().broadcast(view(in, count), view(out, count), root, stream);
  }
  /// In place: root sends `data`, every other rank receives into it.
  template <class T>
  void broadcast(T* data, std::size_t count, int root, StreamParam stream = {}) {
    self().broadcast(view(data, count), view(data, count), root, stream);
  }
  /// `out` is written on root only (other ranks may pass nullptr).
  template <class T>
  void reduce(const T* in, T* out, std::size_t count, ReduceOp op, int root, StreamParam stream = {}) {
    self().reduce(view(in, count), view(out, count), op, root, stream);
  }
  /// `count` elements from each rank; `out` holds count * size().
  template <class T>
  void all_gather(const T* in, T* out, std::size_t count, StreamParam stream = {}) {
    self().all_gather(view(in, count), view(out, count * ranks()), stream);
  }
  /// `in` holds count * size(); each rank receives `count` reduced elements.
  template <class T>
  void reduce_scatter(const T* in, T* out, std::size_t count, ReduceOp op = ReduceOp::kSum, StreamParam stream = {}) {
    self().reduce_scatter(view(in, count * ranks()), view(out, count), op, stream);
  }
  /// `count` elements to and from each rank; `in` and `out` hold count * size().
  template <class T>
  void all_to_all(const T* in, T* out, std::size_t count, StreamParam stream = {}) {
    self().all_to_all(view(in, count * ranks()), view(out, count * ranks()), stream);
  }
  /// `count` elements from each rank; `out` (count * size()) is written on root only.
  template <class T>
  void gather(const T* in, T* out, std::size_t count, int root, StreamParam stream = {}) {
    self().gather(view(in, count), view(out, count * ranks()), root, stream);
  }
  /// `in` (count * size()) is read on root only; each rank receives `count` elements.
  template <class T>
  void scatter(const T* in, T* out, std::size_t count, int root, StreamParam stream = {}) {
    self().scatter(view(in, count * ranks()), view(out, count), root, stream);
  }
  template <class T>
  void send(const T* in, std::size_t count, int peer, StreamParam stream = {}) {
    self().send(view(in, count), peer, stream);
  }
  template <class T>
  void recv(T* out, std::size_t count, int peer, StreamParam stream = {}) {
    self().recv(view(out, count), peer, stream);
  }

  // ---- spans (the count is the span's size) ------------------------------------------------------

  template <class T>
  void all_reduce(std::span<const std::type_identity_t<T>> in, std::span<T> out, ReduceOp op = ReduceOp::kSum,
                  StreamParam stream = {}) {
    self().all_reduce(view(in), view(out), op, stream);
  }
  /// In place.
  template <class T>
  void all_reduce(std::span<T> data, ReduceOp op = ReduceOp::kSum, StreamParam stream = {}) {
    self().all_reduce(view(data), view(data), op, stream);
  }
  template <class T>
  void broadcast(std::span<const std::type_identity_t<T>> in, std::span<T> out, int root, StreamParam stream = {}) {
    self().broadcast(view(in), view(out), root, stream);
  }
  /// In place.
  template <class T>
  void broadcast(std::span<T> data, int root, StreamParam stream = {}) {
    self().broadcast(view(data), view(data), root, stream);
  }
  template <class T>
  void reduce(std::span<const std::type_identity_t<T>> in, std::span<T> out, ReduceOp op, int root,
              StreamParam stream = {}) {
    self().reduce(view(in), view(out), op, root, stream);
  }
  template <class T>
  void all_gather(std::span<const std::type_identity_t<T>> in, std::span<T> out, StreamParam stream = {}) {
    self().all_gather(view(in), view(out), stream);
  }
  /// Rank r contributes counts[r] elements; `out` holds their sum, in rank order.
  template <class T>
  void all_gather_uneven(std::span<const std::type_identity_t<T>> in, std::span<T> out,
                         std::span<const std::size_t> counts, StreamParam stream = {}) {
    self().all_gather_uneven(view(in), view(out), counts, stream);
  }
  template <class T>
  void reduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out, ReduceOp op = ReduceOp::kSum,
                      StreamParam stream = {}) {
    self().reduce_scatter(view(in), view(out), op, stream);
  }
  template <class T>
  void all_to_all(std::span<const std::type_identity_t<T>> in, std::span<T> out, StreamParam stream = {}) {
    self().all_to_all(view(in), view(out), stream);
  }
  template <class T>
  void gather(std::span<const std::type_identity_t<T>> in, std::span<T> out, int root, StreamParam stream = {}) {
    self().gather(view(in), view(out), root, stream);
  }
  template <class T>
  void scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out, int root, StreamParam stream = {}) {
    self().scatter(view(in), view(out), root, stream);
  }
  template <class T>
  void send(std::span<T> in, int peer, StreamParam stream = {}) {
    self().send(view(std::span<const T>(in)), peer, stream);
  }
  template <class T>
  void recv(std::span<T> out, int peer, StreamParam stream = {}) {
    self().recv(view(out), peer, stream);
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
  std::size_t ranks() { return static_cast<std::size_t>(self().size()); }

  template <class T>
  static TensorView view(T* data, std::size_t count) {
    return TensorView::of(data, count, Derived::memory_kind);
  }
  template <class T>
  static TensorView view(std::span<T> values) {
    return TensorView::of(values, Derived::memory_kind);
  }
};

}  // namespace ncclkit::detail
