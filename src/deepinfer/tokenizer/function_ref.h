// A non-owning reference to a callable, for the per-piece callbacks of the encode path (std::function would
// allocate for larger captures and costs an extra indirection). The callable must outlive the call it is
// passed to, which holds for a lambda written in the argument list.
#pragma once

#include <type_traits>
#include <utility>

namespace deepinfer::tokenizer {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT: implicit, like std::function
      : object_(const_cast<void*>(static_cast<const void*>(&f))), call_([](void* o, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(args)...);
        }) {}
  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace deepinfer::tokenizer
