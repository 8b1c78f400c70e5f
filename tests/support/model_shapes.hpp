#pragma once
// The parameter shapes of real models (bench/data/*.shapes.txt: "name AxBxC" per line, '#'
// comments), for fusion tests. Found next to this file's source tree through __FILE__, which
// CMake makes absolute, so no build setting is needed.

#include <cstdint>     // std::int64_t
#include <filesystem>  // std::filesystem::path
#include <fstream>     // std::ifstream
#include <sstream>     // std::istringstream
#include <stdexcept>   // std::runtime_error
#include <string>      // std::string, std::stoll
#include <utility>     // std::move
#include <vector>      // std::vector

#include "ncclkit/fusion/layout.hpp"

namespace ncclkit::testing {

struct ModelTensor {
  std::string name;
  std::vector<std::int64_t> shape;
};

/// The tensors of bench/data/<model>.shapes.txt, in registration order.
inline std::vector<ModelTensor> read_model_shapes(const std::string& model) {
  // The source tree this was compiled from, else the working folder (binaries carried to a GPU
  // machine run in a copy of the repository root).
  auto path = std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "bench" / "data" / (model + ".shapes.txt");
  if (!std::filesystem::exists(path)) path = std::filesystem::path("bench") / "data" / (model + ".shapes.txt");
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::vector<ModelTensor> tensors;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    ModelTensor tensor;
    std::string shape;
    if (!(fields >> tensor.name >> shape)) throw std::runtime_error("bad line in " + path.string() + ": " + line);
    std::istringstream extents(shape);
    for (std::string extent; std::getline(extents, extent, 'x');) tensor.shape.push_back(std::stoll(extent));
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

/// A finalized float32 layout of `model`'s tensors.
inline fusion::FusedLayout model_layout(const std::string& model, const fusion::LayoutOptions& options = {}) {
  fusion::FusedLayout layout;
  for (const ModelTensor& t : read_model_shapes(model)) layout.add(t.name, t.shape, DataType::kFloat32);
  layout.finalize(options);
  return layout;
}

}  // namespace ncclkit::testing
