// What crosses the wire in an RPC: a dynamically typed Value (none, bool,
// integer, double, string, tensor, list of values, RRef), like the arguments of
// torch.distributed.rpc calls. Tensors travel without extra copies: the sender
// writes their storage straight from memory (scatter-gather), the receiver
// reads straight into a freshly allocated tensor. An Object is a value that
// lives only where it was made (a module, an optimizer): it may be held by an
// RRef on its owner but never sent.
//
// Accessors throw DdprunError naming the expected and the actual type. Values
// are plain data: copying one copies the handles (tensors share storage, as
// at::Tensor does).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace ddprun::rpc {

class RRef;
namespace detail {
struct RRefState;
}

// Base of owner-only values (modules, optimizers) held by RRefs.
class Object {
 public:
  virtual ~Object() = default;
  // A short name for error messages ("EmbeddingBag", "optimizer").
  virtual std::string typeName() const = 0;
};

class Value {
 public:
  using List = std::vector<Value>;

  Value() = default;
  Value(bool v) : v_(v) {}
  Value(int v) : v_(int64_t{v}) {}
  Value(int64_t v) : v_(v) {}
  Value(double v) : v_(v) {}
  Value(const char* v) : v_(std::string(v)) {}
  Value(std::string v) : v_(std::move(v)) {}
  Value(at::Tensor v) : v_(std::move(v)) {}
  Value(List v) : v_(std::move(v)) {}
  Value(std::vector<at::Tensor> v);
  Value(const RRef& v);
  Value(std::shared_ptr<Object> v) : v_(std::move(v)) {}

  bool isNone() const { return v_.index() == 0; }
  bool isBool() const { return std::holds_alternative<bool>(v_); }
  bool isInt() const { return std::holds_alternative<int64_t>(v_); }
  bool isDouble() const { return std::holds_alternative<double>(v_); }
  bool isString() const { return std::holds_alternative<std::string>(v_); }
  bool isTensor() const { return std::holds_alternative<at::Tensor>(v_); }
  bool isList() const { return std::holds_alternative<List>(v_); }
  bool isRRef() const { return std::holds_alternative<std::shared_ptr<detail::RRefState>>(v_); }
  bool isObject() const { return std::holds_alternative<std::shared_ptr<Object>>(v_); }

  bool toBool() const;
  int64_t toInt() const;
  double toDouble() const;  // integers convert
  const std::string& toString() const;
  const at::Tensor& toTensor() const;
  const List& toList() const;
  List& toList();
  std::vector<at::Tensor> toTensorList() const;
  RRef toRRef() const;
  const std::shared_ptr<Object>& toObject() const;
  template <class T>
  std::shared_ptr<T> toObjectAs() const {
    auto typed = std::dynamic_pointer_cast<T>(toObject());
    if (!typed) throwType("a different object type");
    return typed;
  }

  // "tensor", "list", ... for messages.
  std::string typeName() const;

  using Storage = std::variant<std::monostate, bool, int64_t, double, std::string, at::Tensor, List,
                               std::shared_ptr<detail::RRefState>, std::shared_ptr<Object>>;
  const Storage& storage() const { return v_; }

 private:
  [[noreturn]] void throwType(const char* expected) const;
  Storage v_;
};

using Args = std::vector<Value>;

}  // namespace ddprun::rpc
