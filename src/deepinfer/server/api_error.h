// ApiError: a client-visible failure with its HTTP status and the OpenAI error body
// {"error": {"message", "type", "param", "code"}}. Protocol code throws it; the HTTP layer turns it into the
// response (Anthropic routes render the same fields in Anthropic's shape).
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace deepinfer::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string type = {}, std::string code = {})
      : std::runtime_error(message),
        status_(status),
        message_(std::move(message)),
        param_(std::move(param)),
        type_(type.empty() ? default_type(status) : std::move(type)),
        code_(std::move(code)) {}

  int status() const { return status_; }
  const std::string& message() const { return message_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }
  const std::string& code() const { return code_; }

  nlohmann::json openai_body() const {
    nlohmann::json e = {{"message", message_}, {"type", type_}, {"param", nullptr}, {"code", nullptr}};
    if (!param_.empty()) e["param"] = param_;
    if (!code_.empty()) e["code"] = code_;
    return {{"error", e}};
  }
  // Anthropic: {"type": "error", "error": {"type": ..., "message": ...}}.
  nlohmann::json anthropic_body() const {
    return {{"type", "error"}, {"error", {{"type", anthropic_type()}, {"message", message_}}}};
  }
  std::string anthropic_type() const {
    switch (status_) {
      case 401:
        return "authentication_error";
      case 404:
        return "not_found_error";
      case 413:
        return "request_too_large";
      case 429:
        return "rate_limit_error";
      case 503:
        return "overloaded_error";
      default:
        return status_ >= 500 ? "api_error" : "invalid_request_error";
    }
  }

  static std::string default_type(int status) {
    switch (status) {
      case 401:
        return "authentication_error";
      case 404:
        return "not_found_error";
      case 429:
        return "rate_limit_exceeded";
      default:
        return status >= 500 ? "server_error" : "invalid_request_error";
    }
  }

 private:
  int status_;
  std::string message_, param_, type_, code_;
};

// 400 naming the field.
inline ApiError bad_request(const std::string& param, const std::string& message) {
  return ApiError(400, message, param);
}

}  // namespace deepinfer::server
