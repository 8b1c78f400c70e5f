#pragma once
// A small strict JSON reader for tests that check files ncclkit writes (timeline traces): the
// whole grammar of RFC 8259 (objects, arrays, strings with escapes, numbers, true, false,
// null), nothing after the value but blanks, and an error naming the offset otherwise.

#include <cctype>     // std::isdigit
#include <cstddef>    // std::size_t
#include <cstdlib>    // std::strtod
#include <map>        // std::map
#include <memory>     // std::shared_ptr
#include <stdexcept>  // std::runtime_error
#include <string>     // std::string
#include <vector>     // std::vector

namespace ncclkit_test {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::map<std::string, JsonValue> object;

  bool has(const std::string& key) const { return kind == Kind::kObject && object.count(key) != 0; }
  /// The member `key`; std::runtime_error naming it when this is not an object that has it.
  const JsonValue& operator[](const std::string& key) const {
    if (!has(key)) throw std::runtime_error("JSON: no member \"" + key + "\"");
    return object.at(key);
  }
};

namespace detail {

class JsonReader {
 public:
  explicit JsonReader(const std::string& text) : text_(text) {}

  JsonValue document() {
    JsonValue value = read_value();
    blanks();
    if (at_ != text_.size()) fail("text after the value");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(at_));
  }
  void blanks() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\r' || text_[at_] == '\t')) {
      ++at_;
    }
  }
  void expect(char c) {
    if (at_ >= text_.size() || text_[at_] != c) fail(std::string("expected '") + c + "'");
    ++at_;
  }
  void literal(const char* word) {
    for (const char* p = word; *p != '\0'; ++p) expect(*p);
  }

  JsonValue read_value() {
    blanks();
    if (at_ >= text_.size()) fail("unexpected end");
    JsonValue value;
    switch (text_[at_]) {
      case '{':
        value.kind = JsonValue::Kind::kObject;
        ++at_;
        blanks();
        if (at_ < text_.size() && text_[at_] == '}') {
          ++at_;
          return value;
        }
        for (;;) {
          blanks();
          std::string key = read_string();
          blanks();
          expect(':');
          if (value.object.count(key) != 0) fail("duplicate key \"" + key + "\"");
          value.object.emplace(std::move(key), read_value());
          blanks();
          if (at_ < text_.size() && text_[at_] == ',') {
            ++at_;
            continue;
          }
          expect('}');
          return value;
        }
      case '[':
        value.kind = JsonValue::Kind::kArray;
        ++at_;
        blanks();
        if (at_ < text_.size() && text_[at_] == ']') {
          ++at_;
          return value;
        }
        for (;;) {
          value.array.push_back(read_value());
          blanks();
          if (at_ < text_.size() && text_[at_] == ',') {
            ++at_;
            continue;
          }
          expect(']');
          return value;
        }
      case '"':
        value.kind = JsonValue::Kind::kString;
        value.string = read_string();
        return value;
      case 't':
        literal("true");
        value.kind = JsonValue::Kind::kBool;
        value.boolean = true;
        return value;
      case 'f':
        literal("false");
        value.kind = JsonValue::Kind::kBool;
        return value;
      case 'n':
        literal("null");
        return value;
      default:
        value.kind = JsonValue::Kind::kNumber;
        value.number = read_number();
        return value;
    }
  }

  std::string read_string() {
    expect('"');
    std::string out;
    for (;;) {
      if (at_ >= text_.size()) fail("unterminated string");
      const char c = text_[at_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (at_ >= text_.size()) fail("unterminated escape");
      const char e = text_[at_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(e);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          if (at_ + 4 > text_.size()) fail("short \\u escape");
          unsigned code = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = text_[at_++];
            code <<= 4;
            if (h >= '0' && h <= '9') {
              code |= static_cast<unsigned>(h - '0');
            } else if (h >= 'a' && h <= 'f') {
              code |= static_cast<unsigned>(h - 'a' + 10);
            } else if (h >= 'A' && h <= 'F') {
              code |= static_cast<unsigned>(h - 'A' + 10);
            } else {
              fail("bad \\u escape");
            }
          }
          if (code >= 0x80) fail("\\u escape beyond ASCII (not needed by these tests)");
          out.push_back(static_cast<char>(code));
          break;
        }
        default:
          fail("bad escape");
      }
    }
  }

  double read_number() {
    const std::size_t start = at_;
    if (at_ < text_.size() && text_[at_] == '-') ++at_;
    const auto digits = [&] {
      const std::size_t from = at_;
      while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
      if (at_ == from) fail("expected a digit");
    };
    if (at_ < text_.size() && text_[at_] == '0') {
      ++at_;
    } else {
      digits();
    }
    if (at_ < text_.size() && text_[at_] == '.') {
      ++at_;
      digits();
    }
    if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      ++at_;
      if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
      digits();
    }
    return std::strtod(text_.substr(start, at_ - start).c_str(), nullptr);
  }

  const std::string& text_;
  std::size_t at_ = 0;
};

}  // namespace detail

/// Parses `text` as one JSON document; std::runtime_error naming the offset when it is not.
inline JsonValue parse_json(const std::string& text) { return detail::JsonReader(text).document(); }

}  // namespace ncclkit_test
