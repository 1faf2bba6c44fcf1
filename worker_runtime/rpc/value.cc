#include "worker_runtime/rpc/value.h"

#include <fmt/format.h>

#include "common/error.h"
#include "worker_runtime/rpc/internal.h"

namespace ddprun::rpc {

Value::Value(std::vector<at::Tensor> v) {
  List list;
  list.reserve(v.size());
  for (auto& t : v) list.emplace_back(std::move(t));
  v_ = std::move(list);
}
Value::Value(const RRef& v) : v_(v.state()) {}

std::string Value::typeName() const {
  static const char* names[] = {"none", "bool", "int", "double", "string", "tensor", "list", "RRef", "object"};
  if (isObject()) return "object " + toObject()->typeName();
  return names[v_.index()];
}
void Value::throwType(const char* expected) const {
  throw DdprunError(fmt::format("rpc value: expected {}, got {}", expected, typeName()));
}
bool Value::toBool() const {
  if (!isBool()) throwType("bool");
  return std::get<bool>(v_);
}
int64_t Value::toInt() const {
  if (!isInt()) throwType("int");
  return std::get<int64_t>(v_);
}
double Value::toDouble() const {
  if (isInt()) return static_cast<double>(std::get<int64_t>(v_));
  if (!isDouble()) throwType("double");
  return std::get<double>(v_);
}
const std::string& Value::toString() const {
  if (!isString()) throwType("string");
  return std::get<std::string>(v_);
}
const at::Tensor& Value::toTensor() const {
  if (!isTensor()) throwType("tensor");
  return std::get<at::Tensor>(v_);
}
const Value::List& Value::toList() const {
  if (!isList()) throwType("list");
  return std::get<List>(v_);
}
Value::List& Value::toList() {
  if (!isList()) throwType("list");
  return std::get<List>(v_);
}
std::vector<at::Tensor> Value::toTensorList() const {
  std::vector<at::Tensor> out;
  for (const auto& v : toList()) out.push_back(v.toTensor());
  return out;
}
RRef Value::toRRef() const {
  if (!isRRef()) throwType("RRef");
  return RRef(std::get<std::shared_ptr<detail::RRefState>>(v_));
}
const std::shared_ptr<Object>& Value::toObject() const {
  if (!isObject()) throwType("object");
  return std::get<std::shared_ptr<Object>>(v_);
}

}  // namespace ddprun::rpc
