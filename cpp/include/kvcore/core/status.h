// Status: an Error and, for an error, the recipe of its message: a printf-style
// format (a string literal) and its arguments packed into a few bytes. The text
// is formatted only when someone asks (message()), so making an error costs a
// few stores, success carries no text at all, and a Status is 72 bytes that
// copy without strlen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "kvcore/core/error.h"

namespace kvcore {

/// A formatted message, by value: no allocation, no lifetime to track.
struct Message {
  /// Longer messages are cut (never overflowed) and end in "...".
  static constexpr std::size_t kCapacity = 256;
  char text[kCapacity] = {};

  const char* c_str() const noexcept { return text; }
  bool empty() const noexcept { return text[0] == '\0'; }
};

class [[nodiscard]] Status {
 public:
  /// Bytes for a message's packed arguments: an integer takes 1 + (1 to 10)
  /// bytes, a string 2 + its length. A string that does not fit is cut, and
  /// arguments past the room print as "?".
  static constexpr std::size_t kArgBytes = 56;

  Status() noexcept = default;
  // Implicit so that `return Error::Ok;` and `Status s = e;` read naturally.
  Status(Error code) noexcept : code_(code) {}  // NOLINT

  /// An error whose message is `format` (a string literal: it is kept by
  /// pointer) with `args`: integers of any width, `const char*` or
  /// `std::string_view` (copied). Conversions: d i u x X o c s, with flags,
  /// width and precision (`*` takes an int argument); length modifiers are
  /// accepted and ignored, each argument printing as its own type.
  template <std::size_t N, typename... Args>
  static Status make(Error code, const char (&format)[N], const Args&... args) noexcept {
    return make_from(code, format, args...);  // one body per argument list, not per format length
  }

  bool ok() const noexcept { return code_ == Error::Ok; }
  Error code() const noexcept { return code_; }
  /// The message, formatted now; empty for Ok and for errors made from a bare code.
  Message message() const noexcept {
    Message out;
    if (format_ != nullptr) format_into(out);
    return out;
  }
  // Implicit so that functions documented as returning Error can return Status.
  operator Error() const noexcept { return code_; }  // NOLINT

 private:
  enum Tag : unsigned char { kSigned = 1, kUnsigned = 2, kText = 3 };
  // Or'ed into an integer's tag when it is 32 bits wide or less, so that %x of
  // an int shows 32 bits, as printf would.
  static constexpr unsigned char kNarrow = 0x10;

  // --- packing (when the error is made) ---
  template <typename... Args>
  static Status make_from(Error code, const char* format, const Args&... args) noexcept {
    Status s(code);
    s.format_ = format;
    (s.pack(args), ...);
    return s;
  }

  template <typename T>
  void pack(const T& value) noexcept {
    if constexpr (std::is_same<T, bool>::value) {
      pack_integer(kUnsigned, value ? 1u : 0u);
    } else if constexpr (std::is_integral<T>::value && std::is_signed<T>::value) {
      const std::int64_t v = value;  // zigzag: small magnitudes take one byte
      pack_integer(kSigned | (sizeof(T) <= 4 ? kNarrow : 0),
                   (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63));
    } else if constexpr (std::is_integral<T>::value) {
      pack_integer(kUnsigned | (sizeof(T) <= 4 ? kNarrow : 0), static_cast<std::uint64_t>(value));
    } else if constexpr (std::is_enum<T>::value) {
      pack(static_cast<typename std::underlying_type<T>::type>(value));
    } else {
      static_assert(std::is_convertible<T, std::string_view>::value,
                    "Status::make takes integers, enums, const char* and std::string_view");
      pack_text(text_of(value));
    }
  }
  template <typename T>
  static std::string_view text_of(const T& value) noexcept {
    if constexpr (std::is_convertible<T, const char*>::value) {
      const char* s = value;
      return s == nullptr ? std::string_view("(null)") : std::string_view(s);
    } else {
      return std::string_view(value);
    }
  }

  void pack_integer(unsigned tag, std::uint64_t v) noexcept {
    unsigned char bytes[11];
    std::size_t n = 0;
    bytes[n++] = static_cast<unsigned char>(tag);
    do {
      bytes[n++] = static_cast<unsigned char>((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
      v >>= 7;
    } while (v != 0);
    if (full_ || size_ + n > kArgBytes) {  // once one is left out, so are the rest
      full_ = true;
      return;
    }
    std::memcpy(args_ + size_, bytes, n);
    size_ = static_cast<std::uint16_t>(size_ + n);
  }

  void pack_text(std::string_view s) noexcept {
    if (full_ || std::size_t{size_} + 2 > kArgBytes) {
      full_ = true;
      return;
    }
    static_assert(kArgBytes - 2 <= 255, "a text argument's length is one byte");
    const std::size_t room = kArgBytes - size_ - 2;
    const std::size_t n = s.size() < room ? s.size() : room;
    const bool cut = n < s.size();
    args_[size_] = kText;
    args_[size_ + 1] = static_cast<unsigned char>(n);
    if (n != 0) std::memcpy(args_ + size_ + 2, s.data(), n);
    size_ = static_cast<std::uint16_t>(size_ + 2 + n);
    if (cut) {  // later arguments print as "?"; this one ends in "..."
      full_ = true;
      cut_text_ = true;
    }
  }

  // --- formatting (when the message is asked for) ---
  struct Arg {
    Tag tag = kSigned;
    std::int64_t i = 0;
    std::uint64_t u = 0;
    std::string_view text;
    bool present = false;
  };

  Arg next_arg(std::size_t& at) const noexcept {
    Arg a;
    if (at >= size_) return a;
    a.present = true;
    const unsigned char tag = args_[at++];
    a.tag = static_cast<Tag>(tag & ~kNarrow);
    if (a.tag == kText) {
      const std::size_t n = args_[at++];
      a.text = std::string_view(reinterpret_cast<const char*>(args_ + at), n);
      at += n;
      return a;
    }
    std::uint64_t v = 0;
    for (int shift = 0; at < size_; shift += 7) {
      const unsigned char b = args_[at++];
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) break;
    }
    // Undo the zigzag of signed values; unsigned conversions see two's complement.
    a.i = a.tag == kSigned ? static_cast<std::int64_t>((v >> 1) ^ (~(v & 1) + 1)) : static_cast<std::int64_t>(v);
    a.u = a.tag == kSigned ? static_cast<std::uint64_t>(a.i) : v;
    if ((tag & kNarrow) != 0) a.u &= 0xffffffffu;
    return a;
  }

  void format_into(Message& out) const noexcept {
    char* dst = out.text;
    std::size_t left = Message::kCapacity - 1;  // room before the terminator
    bool cut = false;                           // some text did not fit
    auto put = [&](const char* s, std::size_t n) {
      if (n > left) {
        n = left;
        cut = true;
      }
      std::memcpy(dst, s, n);
      dst += n;
      left -= n;
    };
    std::size_t at = 0;
    const char* f = format_;
    while (*f != '\0' && left > 0) {
      if (*f != '%') {
        const char* next = std::strchr(f, '%');
        const std::size_t n = next == nullptr ? std::strlen(f) : static_cast<std::size_t>(next - f);
        put(f, n);
        f += n;
        continue;
      }
      if (f[1] == '%') {
        put("%", 1);
        f += 2;
        continue;
      }
      // One conversion: %[flags][width][.precision][length]conversion. Each
      // argument prints as the type it was packed with; a `*` takes an integer.
      Spec spec;
      ++f;
      while (*f != '\0' && std::strchr("-+ #0", *f) != nullptr) spec.add(*f++);
      spec.star(f, *this, at);
      const std::size_t width_end = spec.size;
      const int width_stars = spec.n_stars;
      if (*f == '.') {
        spec.add(*f++);
        spec.star(f, *this, at);
      }
      while (*f != '\0' && std::strchr("hljzt", *f) != nullptr) ++f;
      const char conversion = *f;
      if (conversion == '\0') break;
      ++f;
      const Arg a = next_arg(at);
      char piece[Message::kCapacity];
      int n = 0;
      if (!a.present) {
        piece[0] = '?';
        n = 1;
      } else if (a.tag == kText) {
        spec.size = width_end;  // the packed length is the precision
        spec.n_stars = width_stars;
        spec.add('.');
        spec.add('*');
        spec.add('s');
        n = spec.print(piece, static_cast<int>(a.text.size()), a.text.data());
        if (cut_text_ && at >= size_ && n >= 0 && static_cast<std::size_t>(n) + 4 <= sizeof(piece)) {
          std::memcpy(piece + n, "...", 4);
          n += 3;
        }
      } else if (conversion == 'c') {
        piece[0] = static_cast<char>(a.i);
        n = 1;
      } else {
        const bool unsigned_conversion = std::strchr("uxXo", conversion) != nullptr;
        spec.add('l');
        spec.add('l');
        if (unsigned_conversion) {
          spec.add(conversion);
          n = spec.print(piece, static_cast<unsigned long long>(a.u));
        } else if (a.tag == kUnsigned) {
          spec.add('u');
          n = spec.print(piece, static_cast<unsigned long long>(a.u));
        } else {
          spec.add('d');
          n = spec.print(piece, static_cast<long long>(a.i));
        }
      }
      if (n > 0) {
        const std::size_t shown = static_cast<std::size_t>(n) < sizeof(piece) ? static_cast<std::size_t>(n)
                                                                              : sizeof(piece) - 1;
        put(piece, shown);
      }
    }
    *dst = '\0';
    if (cut || *f != '\0') std::memcpy(out.text + Message::kCapacity - 4, "...", 4);
  }

  // One conversion rebuilt for snprintf, with the values its `*`s took.
  struct Spec {
    char text[24] = {'%'};
    std::size_t size = 1;
    int stars[2] = {0, 0};
    int n_stars = 0;

    void add(char c) noexcept {
      if (size < sizeof(text) - 1) text[size++] = c;
    }
    // Digits, or a `*` that takes the next argument.
    void star(const char*& f, const Status& status, std::size_t& at) noexcept {
      if (*f == '*') {
        const Arg a = status.next_arg(at);
        if (n_stars < 2) stars[n_stars++] = a.tag == kText ? 0 : static_cast<int>(a.i);
        add(*f++);
        return;
      }
      while (*f >= '0' && *f <= '9') add(*f++);
    }
    template <typename... Ts>
    int print(char (&piece)[Message::kCapacity], Ts... values) noexcept {
      text[size] = '\0';
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
#pragma GCC diagnostic ignored "-Wformat-security"
#endif
      if (n_stars == 2) return std::snprintf(piece, sizeof(piece), text, stars[0], stars[1], values...);
      if (n_stars == 1) return std::snprintf(piece, sizeof(piece), text, stars[0], values...);
      return std::snprintf(piece, sizeof(piece), text, values...);
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
    }
  };

  Error code_ = Error::Ok;
  std::uint16_t size_ = 0;  // bytes of args_ in use
  bool full_ = false;       // an argument did not fit
  bool cut_text_ = false;   // the last text argument was cut
  const char* format_ = nullptr;
  unsigned char args_[kArgBytes];  // the first size_ bytes are set
};

static_assert(sizeof(Status) <= 72, "a Status travels by value: keep it small");

}  // namespace kvcore
