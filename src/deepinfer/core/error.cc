#include "deepinfer/core/error.h"

#include <cstring>

namespace deepinfer {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kNotFound: return "NotFound";
    case ErrorCode::kResourceExhausted: return "ResourceExhausted";
    case ErrorCode::kUnsupported: return "Unsupported";
    case ErrorCode::kInternal: return "Internal";
  }
  return "Unknown";
}

static std::string base_name(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}

Error::Error(ErrorCode code, std::string message, const char* file, int line)
    : std::runtime_error(std::string(error_code_name(code)) + ": " + message +
                         (line > 0 ? " [" + base_name(file) + ":" + std::to_string(line) + "]" : "")),
      code_(code),
      message_(std::move(message)),
      file_(file),
      line_(line) {}

namespace detail {
void ErrorStream::raise() const {
  std::string msg = stream_.str();
  if (msg.empty() && condition_ != nullptr) msg = std::string("check failed: ") + condition_;
  throw Error(code_, std::move(msg), file_, line_);
}
}  // namespace detail

}  // namespace deepinfer
