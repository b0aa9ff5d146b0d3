// deepinfer::Error and the one family of check macros used everywhere.
//
//   DI_CHECK(n > 0) << "batch size must be positive, got " << n;            // InvalidArgument
//   DI_CHECK_CODE(f.good(), ErrorCode::kNotFound) << "cannot open " << path;
//   DI_FAIL(ErrorCode::kUnsupported) << "model_type " << t;                   // unconditional
//
// The message is only built when the check fails.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace deepinfer {

enum class ErrorCode { kInvalidArgument, kNotFound, kResourceExhausted, kUnsupported, kInternal };

std::string_view error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message, const char* file = "", int line = 0);
  ErrorCode code() const { return code_; }
  // The message without the "file:line" suffix, for API answers.
  const std::string& message() const { return message_; }
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  ErrorCode code_;
  std::string message_;
  const char* file_;
  int line_;
};

namespace detail {

class ErrorStream {
 public:
  ErrorStream(ErrorCode code, const char* file, int line, const char* condition)
      : code_(code), file_(file), line_(line), condition_(condition) {}
  template <typename T>
  ErrorStream& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  [[noreturn]] void raise() const;

 private:
  ErrorCode code_;
  const char* file_;
  int line_;
  const char* condition_;
  std::ostringstream stream_;
};

// `Thrower() & stream` has lower precedence than `<<`, so the whole message is streamed before the throw.
struct Thrower {
  [[noreturn]] void operator&(const ErrorStream& s) const { s.raise(); }
};

}  // namespace detail
}  // namespace deepinfer

#define DI_CHECK_CODE(cond, code)                                   \
  (cond) ? (void)0                                                  \
         : ::deepinfer::detail::Thrower() &                         \
               ::deepinfer::detail::ErrorStream(code, __FILE__, __LINE__, #cond)
#define DI_CHECK(cond) DI_CHECK_CODE(cond, ::deepinfer::ErrorCode::kInvalidArgument)
#define DI_CHECK_INTERNAL(cond) DI_CHECK_CODE(cond, ::deepinfer::ErrorCode::kInternal)
#define DI_FAIL(code) \
  ::deepinfer::detail::Thrower() & ::deepinfer::detail::ErrorStream(code, __FILE__, __LINE__, nullptr)
