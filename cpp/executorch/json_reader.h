// JsonDocument: a small, strict JSON reader (RFC 8259) for files such as a Hugging Face
// tokenizer.json, exception-free and RTTI-free. The input is untrusted: every byte is
// bounds-checked, nesting is limited (kMaxDepth), the text must be valid UTF-8, strings
// may not hold raw control characters or lone surrogate escapes, and anything after
// the top-level value other than whitespace is refused. An error is returned as a
// message naming the byte offset, line and column and the rule broken.
//
// The parsed document is stored flat (one node per value, in document order, each
// container followed by its descendants; strings decoded into one arena), and read
// through JsonValue views, valid while the document lives and is not parsed again.
// Numbers are kept as double (integers up to 2^53 are exact; as_int64 checks that).
#pragma once

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace kvcore {
namespace et {

/// The kind of a JSON value.
enum class JsonType : std::uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };

/// The name of a JSON type as messages print it ("null", "a boolean", "a number", ...).
inline const char* json_type_name(JsonType type) {
  switch (type) {
    case JsonType::kNull: return "null";
    case JsonType::kBool: return "a boolean";
    case JsonType::kNumber: return "a number";
    case JsonType::kString: return "a string";
    case JsonType::kArray: return "an array";
    case JsonType::kObject: return "an object";
  }
  return "?";
}

class JsonDocument;

/// A read-only view of one value of a JsonDocument, or a missing value (valid() false:
/// a member or element that is not there). Every accessor is safe on a missing value
/// or on a value of another type: it returns the empty/zero answer.
class JsonValue {
 public:
  JsonValue() = default;

  /// False for a missing value (JsonValue::get of an absent key, first() of an empty array).
  bool valid() const { return doc_ != nullptr; }
  /// The value's type; kNull for a missing value (check valid() to tell them apart).
  JsonType type() const;
  /// True when the value is there and of that type (a missing value is none of them).
  bool is_null() const { return valid() && type() == JsonType::kNull; }
  bool is_bool() const { return valid() && type() == JsonType::kBool; }
  bool is_number() const { return valid() && type() == JsonType::kNumber; }
  bool is_string() const { return valid() && type() == JsonType::kString; }
  bool is_array() const { return valid() && type() == JsonType::kArray; }
  bool is_object() const { return valid() && type() == JsonType::kObject; }

  /// A boolean's value; false for anything else.
  bool boolean() const;
  /// A number's value; 0 for anything else.
  double number() const;
  /// True, with *out set, when this is a number with an integral value in [lo, hi];
  /// false otherwise (not a number, a fraction, out of range).
  bool as_int64(std::int64_t lo, std::int64_t hi, std::int64_t* out) const;
  /// A string's decoded UTF-8 bytes; empty for anything else.
  std::string_view str() const;
  /// The number of elements of an array or members of an object; 0 for anything else.
  std::size_t size() const;
  /// An object's member named `key` (the last one when the key repeats); missing when
  /// absent or when this is not an object. Linear in the object's size.
  JsonValue get(std::string_view key) const;
  /// The first element of an array or the first member's value of an object; missing
  /// when empty or not a container. Walk on with next().
  JsonValue first() const;
  /// The next element or member value after this one in its container; missing after the last.
  JsonValue next() const;
  /// The key of this value when it is an object's member; empty otherwise.
  std::string_view key() const;

 private:
  friend class JsonDocument;
  JsonValue(const JsonDocument* doc, std::uint32_t index, std::uint32_t limit) : doc_(doc), index_(index), limit_(limit) {}
  const JsonDocument* doc_ = nullptr;
  std::uint32_t index_ = 0;
  std::uint32_t limit_ = 0;  // one past the parent's last descendant: where siblings end
};

/// A parsed JSON text.
class JsonDocument {
 public:
  /// Containers deeper than this are refused (a stack bound for untrusted input).
  static constexpr int kMaxDepth = 64;
  /// Texts longer than this (bytes) are refused: node and arena offsets are 32-bit.
  static constexpr std::size_t kMaxBytes = std::size_t{1} << 30;

  /// Parses `text` (UTF-8 bytes). True on success; false with *error set to a message
  /// such as "JSON error at byte 17 (line 2, column 5): expected ':' after an object key".
  /// A failed parse leaves the document empty (root() missing).
  bool parse(std::string_view text, std::string* error);

  /// The top-level value; missing before a successful parse.
  JsonValue root() const { return nodes_.empty() ? JsonValue() : JsonValue(this, 0, 1); }

 private:
  friend class JsonValue;
  struct Node {
    JsonType type = JsonType::kNull;
    bool boolean = false;
    std::uint32_t end = 0;    // one past this node's last descendant
    std::uint32_t count = 0;  // elements or members
    std::uint32_t str = 0, str_len = 0;  // a string's bytes in arena_
    std::uint32_t key = 0, key_len = 0;  // an object member's key in arena_
    double number = 0;
  };

  bool fail(const char* what);
  void skip_space();
  bool parse_value(int depth);
  bool parse_string(std::uint32_t* offset, std::uint32_t* length);
  bool parse_number(double* out);
  bool parse_hex4(unsigned* out);

  std::vector<Node> nodes_;
  std::string arena_;
  std::string_view text_;
  std::size_t pos_ = 0;
  std::string* error_ = nullptr;
};

/// Where `text` stops being valid UTF-8 (a byte offset), or text.size() when it all is.
/// Refuses overlong forms, surrogates (U+D800..U+DFFF) and code points past U+10FFFF.
inline std::size_t utf8_invalid_at(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (n - i < len) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k) {
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return n;
}

/// Appends code point `cp` (at most U+10FFFF, not a surrogate) to `out` as UTF-8.
inline void append_utf8(std::string* out, unsigned cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

/// Reads the whole file at `path` into *out. False with *error naming the path and the
/// system's reason (or that it is larger than `max_bytes`).
inline bool read_whole_file(const char* path, std::size_t max_bytes, std::string* out, std::string* error) {
  std::FILE* f = std::fopen(path, "rb");
  if (f == nullptr) {
    *error = std::string("cannot open ") + path + ": " + std::strerror(errno);
    return false;
  }
  out->clear();
  char buffer[1 << 16];
  bool ok = true;
  for (;;) {
    const std::size_t got = std::fread(buffer, 1, sizeof buffer, f);
    if (got > 0) {
      if (out->size() + got > max_bytes) {
        *error = std::string(path) + " is larger than " + std::to_string(max_bytes) + " bytes";
        ok = false;
        break;
      }
      out->append(buffer, got);
    }
    if (got < sizeof buffer) {
      if (std::ferror(f)) {
        *error = std::string("cannot read ") + path + ": " + std::strerror(errno);
        ok = false;
      }
      break;
    }
  }
  std::fclose(f);
  return ok;
}

// --- JsonValue --------------------------------------------------------------------------

inline JsonType JsonValue::type() const { return valid() ? doc_->nodes_[index_].type : JsonType::kNull; }

inline bool JsonValue::boolean() const { return is_bool() && doc_->nodes_[index_].boolean; }

inline double JsonValue::number() const { return is_number() ? doc_->nodes_[index_].number : 0.0; }

inline bool JsonValue::as_int64(std::int64_t lo, std::int64_t hi, std::int64_t* out) const {
  if (!is_number()) return false;
  const double v = doc_->nodes_[index_].number;
  // Compared as doubles first, so a huge value never reaches the integer conversion.
  if (!(v >= static_cast<double>(lo) && v <= static_cast<double>(hi))) return false;
  const auto i = static_cast<std::int64_t>(v);
  if (static_cast<double>(i) != v || i < lo || i > hi) return false;
  *out = i;
  return true;
}

inline std::string_view JsonValue::str() const {
  if (!is_string()) return {};
  const JsonDocument::Node& n = doc_->nodes_[index_];
  return std::string_view(doc_->arena_.data() + n.str, n.str_len);
}

inline std::size_t JsonValue::size() const {
  return is_array() || is_object() ? doc_->nodes_[index_].count : 0;
}

inline JsonValue JsonValue::get(std::string_view key) const {
  if (!is_object()) return {};
  JsonValue found;
  for (JsonValue v = first(); v.valid(); v = v.next()) {
    if (v.key() == key) found = v;
  }
  return found;
}

inline JsonValue JsonValue::first() const {
  if (!(is_array() || is_object()) || doc_->nodes_[index_].count == 0) return {};
  return JsonValue(doc_, index_ + 1, doc_->nodes_[index_].end);
}

inline JsonValue JsonValue::next() const {
  if (!valid()) return {};
  const std::uint32_t after = doc_->nodes_[index_].end;
  if (after >= limit_) return {};
  return JsonValue(doc_, after, limit_);
}

inline std::string_view JsonValue::key() const {
  if (!valid()) return {};
  const JsonDocument::Node& n = doc_->nodes_[index_];
  return std::string_view(doc_->arena_.data() + n.key, n.key_len);
}

// --- JsonDocument -----------------------------------------------------------------------

inline bool JsonDocument::fail(const char* what) {
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < pos_ && i < text_.size(); ++i) {
    if (text_[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  *error_ = "JSON error at byte " + std::to_string(pos_) + " (line " + std::to_string(line) + ", column " +
            std::to_string(column) + "): " + what;
  return false;
}

inline void JsonDocument::skip_space() {
  while (pos_ < text_.size() &&
         (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r')) {
    ++pos_;
  }
}

inline bool JsonDocument::parse(std::string_view text, std::string* error) {
  nodes_.clear();
  arena_.clear();
  text_ = text;
  pos_ = 0;
  error_ = error;
  bool ok = true;
  if (text.size() > kMaxBytes) {
    ok = fail("the text is longer than 2^30 bytes");
  } else {
    const std::size_t bad = utf8_invalid_at(text);
    if (bad != text.size()) {
      pos_ = bad;
      ok = fail("the text is not valid UTF-8 here");
    }
  }
  if (ok) {
    skip_space();
    ok = parse_value(0);
  }
  if (ok) {
    skip_space();
    if (pos_ != text_.size()) ok = fail("unexpected text after the top-level value");
  }
  if (!ok) {
    nodes_.clear();
    arena_.clear();
  }
  text_ = {};
  error_ = nullptr;
  return ok;
}

inline bool JsonDocument::parse_hex4(unsigned* out) {
  if (text_.size() - pos_ < 4) return fail("a \\u escape needs 4 hex digits");
  unsigned v = 0;
  for (int k = 0; k < 4; ++k) {
    const char c = text_[pos_ + static_cast<std::size_t>(k)];
    unsigned d;
    if (c >= '0' && c <= '9') {
      d = static_cast<unsigned>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      d = static_cast<unsigned>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      d = static_cast<unsigned>(c - 'A' + 10);
    } else {
      return fail("a \\u escape needs 4 hex digits");
    }
    v = v * 16 + d;
  }
  pos_ += 4;
  *out = v;
  return true;
}

// At the opening quote; decodes the string into arena_.
inline bool JsonDocument::parse_string(std::uint32_t* offset, std::uint32_t* length) {
  ++pos_;  // the opening quote
  const std::size_t start = arena_.size();
  for (;;) {
    if (pos_ >= text_.size()) return fail("a string is not closed (no '\"' before the end)");
    // The run of plain bytes up to the next quote, backslash or control character.
    std::size_t run = pos_;
    while (run < text_.size() && text_[run] != '"' && text_[run] != '\\' &&
           static_cast<unsigned char>(text_[run]) >= 0x20) {
      ++run;
    }
    arena_.append(text_.data() + pos_, run - pos_);
    pos_ = run;
    if (pos_ >= text_.size()) continue;
    const char c = text_[pos_];
    if (c == '"') {
      ++pos_;
      break;
    }
    if (c != '\\') return fail("a control character (below 0x20) inside a string must be escaped");
    if (++pos_ >= text_.size()) return fail("a string ends inside an escape");
    const char e = text_[pos_++];
    switch (e) {
      case '"': arena_.push_back('"'); break;
      case '\\': arena_.push_back('\\'); break;
      case '/': arena_.push_back('/'); break;
      case 'b': arena_.push_back('\b'); break;
      case 'f': arena_.push_back('\f'); break;
      case 'n': arena_.push_back('\n'); break;
      case 'r': arena_.push_back('\r'); break;
      case 't': arena_.push_back('\t'); break;
      case 'u': {
        unsigned cp = 0;
        if (!parse_hex4(&cp)) return false;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return fail("a lone low surrogate \\u escape (U+DC00..U+DFFF)");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (text_.size() - pos_ < 2 || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
            return fail("a high surrogate \\u escape not followed by a low one");
          }
          pos_ += 2;
          unsigned low = 0;
          if (!parse_hex4(&low)) return false;
          if (low < 0xDC00 || low > 0xDFFF) return fail("a high surrogate \\u escape not followed by a low one");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        append_utf8(&arena_, cp);
        break;
      }
      default:
        --pos_;
        return fail("an unknown escape in a string (allowed: \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
    }
  }
  *offset = static_cast<std::uint32_t>(start);
  *length = static_cast<std::uint32_t>(arena_.size() - start);
  return true;
}

inline bool JsonDocument::parse_number(double* out) {
  const std::size_t start = pos_;
  const std::size_t n = text_.size();
  auto digit = [&](std::size_t i) { return i < n && text_[i] >= '0' && text_[i] <= '9'; };
  std::size_t i = pos_;
  if (i < n && text_[i] == '-') ++i;
  if (!digit(i)) return fail("a number needs a digit here");
  if (text_[i] == '0') {
    ++i;
  } else {
    while (digit(i)) ++i;
  }
  if (i < n && text_[i] == '.') {
    ++i;
    if (!digit(i)) {
      pos_ = i;
      return fail("a number's '.' must be followed by a digit");
    }
    while (digit(i)) ++i;
  }
  if (i < n && (text_[i] == 'e' || text_[i] == 'E')) {
    ++i;
    if (i < n && (text_[i] == '+' || text_[i] == '-')) ++i;
    if (!digit(i)) {
      pos_ = i;
      return fail("a number's exponent needs a digit");
    }
    while (digit(i)) ++i;
  }
  double v = 0;
  const auto r = std::from_chars(text_.data() + start, text_.data() + i, v);
  if (r.ec != std::errc() || r.ptr != text_.data() + i) return fail("a number out of the range of a double");
  pos_ = i;
  *out = v;
  return true;
}

inline bool JsonDocument::parse_value(int depth) {
  if (depth > kMaxDepth) return fail("nesting deeper than 64 arrays/objects");
  if (pos_ >= text_.size()) return fail("expected a value, found the end of the text");
  if (nodes_.size() >= 0xFFFFFFF0u) return fail("too many values");
  const std::uint32_t index = static_cast<std::uint32_t>(nodes_.size());
  nodes_.emplace_back();
  const char c = text_[pos_];
  auto literal = [&](const char* word, JsonType type, bool value) {
    const std::size_t len = std::strlen(word);
    if (text_.substr(pos_, len) != word) return fail("expected a value (null, true, false, a number, a string, [ or {)");
    pos_ += len;
    nodes_[index].type = type;
    nodes_[index].boolean = value;
    return true;
  };
  bool ok = true;
  if (c == 'n') {
    ok = literal("null", JsonType::kNull, false);
  } else if (c == 't') {
    ok = literal("true", JsonType::kBool, true);
  } else if (c == 'f') {
    ok = literal("false", JsonType::kBool, false);
  } else if (c == '"') {
    std::uint32_t off = 0, len = 0;
    ok = parse_string(&off, &len);
    nodes_[index].type = JsonType::kString;
    nodes_[index].str = off;
    nodes_[index].str_len = len;
  } else if (c == '-' || (c >= '0' && c <= '9')) {
    double v = 0;
    ok = parse_number(&v);
    nodes_[index].type = JsonType::kNumber;
    nodes_[index].number = v;
  } else if (c == '[' || c == '{') {
    const bool object = c == '{';
    const char close = object ? '}' : ']';
    nodes_[index].type = object ? JsonType::kObject : JsonType::kArray;
    ++pos_;
    skip_space();
    std::uint32_t count = 0;
    if (pos_ < text_.size() && text_[pos_] == close) {
      ++pos_;
    } else {
      for (;;) {
        std::uint32_t key = 0, key_len = 0;
        if (object) {
          if (pos_ >= text_.size() || text_[pos_] != '"') return fail("expected a string key in an object");
          if (!parse_string(&key, &key_len)) return false;
          skip_space();
          if (pos_ >= text_.size() || text_[pos_] != ':') return fail("expected ':' after an object key");
          ++pos_;
          skip_space();
        }
        const std::uint32_t child = static_cast<std::uint32_t>(nodes_.size());
        if (!parse_value(depth + 1)) return false;
        nodes_[child].key = key;
        nodes_[child].key_len = key_len;
        ++count;
        skip_space();
        if (pos_ < text_.size() && text_[pos_] == ',') {
          ++pos_;
          skip_space();
          continue;
        }
        if (pos_ < text_.size() && text_[pos_] == close) {
          ++pos_;
          break;
        }
        return fail(object ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
      }
    }
    nodes_[index].count = count;
  } else {
    ok = fail("expected a value (null, true, false, a number, a string, [ or {)");
  }
  if (!ok) return false;
  nodes_[index].end = static_cast<std::uint32_t>(nodes_.size());
  return true;
}

}  // namespace et
}  // namespace kvcore
