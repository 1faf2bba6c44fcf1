// The RPC message codec without a peer: what the encoder writes, the table parser and the
// decoder read back (values of every plain type and tensors, contiguous or not), and the
// tensor tables a worker must refuse before allocating anything.
#include "worker_runtime/rpc/message_codec.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace ddprun::rpc;
using namespace ddprun::rpc::detail;

namespace {

// What the receiving connection does: check the table, read the tensors' bytes into
// fresh tensors, then decode the body.
Value roundTrip(const Value& v, OutMessage* out = nullptr) {
  MessageEncoder enc{{0, 1, -1}, {}, {}, {}};
  enc.value(v);
  OutMessage m = enc.finish(wire::Kind::kRequest, 42);
  CHECK(m.header.src == 0);
  CHECK(m.header.id == 42);
  CHECK(m.header.meta_bytes == m.meta.size());
  size_t body_offset = 0;
  auto specs = parseTensorTable(m.meta, m.header.tensor_bytes, body_offset);
  REQUIRE(specs.size() == m.tensors.size());
  std::vector<at::Tensor> tensors;
  for (size_t i = 0; i < specs.size(); ++i) {
    at::Tensor t = at::empty(specs[i].sizes, at::TensorOptions().dtype(specs[i].dtype));
    REQUIRE(specs[i].bytes == m.tensors[i].nbytes());
    if (specs[i].bytes > 0) std::memcpy(t.data_ptr(), m.tensors[i].data_ptr(), specs[i].bytes);
    tensors.push_back(t);
  }
  Reader in(m.meta.data() + body_offset, m.meta.size() - body_offset);
  MessageDecoder dec{in, tensors, 0, -1};
  Value back = dec.value();
  if (out) *out = std::move(m);
  return back;
}

// A tensor table of one tensor with the given dtype and sizes.
std::string tableOf(int8_t dtype, const std::vector<int64_t>& sizes) {
  Writer w;
  w.pod(uint32_t{1});
  w.pod(dtype);
  w.pod(static_cast<uint8_t>(sizes.size()));
  for (auto d : sizes) w.pod(d);
  return w.out();
}

std::string tableErrorOf(const std::string& meta, uint64_t tensor_bytes) {
  size_t body_offset = 0;
  try {
    parseTensorTable(meta, tensor_bytes, body_offset);
  } catch (const ddprun::DdprunError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("codec round trip of none bool int double string and nested lists", "[rpc][unit]") {
  Value v(Value::List{Value(), Value(true), Value(int64_t{-7}), Value(2.5), Value("name"),
                      Value(Value::List{Value(1), Value(Value::List{})})});
  Value back = roundTrip(v);
  const auto& l = back.toList();
  REQUIRE(l.size() == 6);
  CHECK(l[0].isNone());
  CHECK(l[1].toBool());
  CHECK(l[2].toInt() == -7);
  CHECK(l[3].toDouble() == 2.5);
  CHECK(l[4].toString() == "name");
  REQUIRE(l[5].toList().size() == 2);
  CHECK(l[5].toList()[0].toInt() == 1);
  CHECK(l[5].toList()[1].toList().empty());
}

TEST_CASE("codec round trip of tensors of several dtypes and a non-contiguous one", "[rpc][unit]") {
  at::Tensor f = at::arange(12, at::kFloat).reshape({3, 4});
  at::Tensor i = at::arange(5, at::kLong);
  at::Tensor strided = f.t();  // non-contiguous: sent through one contiguous copy
  at::Tensor empty = at::empty({0, 3}, at::kDouble);
  OutMessage m;
  Value back = roundTrip(Value(std::vector<at::Tensor>{f, i, strided, empty}), &m);
  CHECK(m.header.tensor_bytes == f.nbytes() + i.nbytes() + strided.nbytes() + empty.nbytes());
  auto ts = back.toTensorList();
  REQUIRE(ts.size() == 4);
  CHECK(at::equal(ts[0], f));
  CHECK(at::equal(ts[1], i));
  CHECK(at::equal(ts[2], strided));
  CHECK(ts[3].sizes() == empty.sizes());
  CHECK(ts[3].scalar_type() == at::kDouble);
  // Contiguous tensors are sent from their own storage.
  CHECK(m.tensors[0].data_ptr() == f.data_ptr());
}

TEST_CASE("an undefined tensor travels as none and an object is refused", "[rpc][unit]") {
  CHECK(roundTrip(Value(at::Tensor())).isNone());
  struct Module : Object {
    std::string typeName() const override { return "EmbeddingBag"; }
  };
  MessageEncoder enc{{0, 1, -1}, {}, {}, {}};
  CHECK_THROWS_WITH(enc.value(Value(std::shared_ptr<Object>(std::make_shared<Module>()))),
                    "rpc: a EmbeddingBag lives on its owner and cannot be sent (use an RRef)");
}

TEST_CASE("tensor tables that must be refused before any allocation", "[rpc][unit]") {
  const auto kFloat = static_cast<int8_t>(at::kFloat);
  CHECK(tableErrorOf(tableOf(kFloat, {2, 3}), 24) == "(accepted)");
  CHECK(tableErrorOf(tableOf(kFloat, {2, 3}), 25) == "rpc: malformed message (tensor bytes)");
  CHECK(tableErrorOf(tableOf(kFloat, {2, -3}), 0) == "rpc: malformed message (negative size)");
  CHECK(tableErrorOf(tableOf(kFloat, {int64_t{1} << 62, 8}), 0) == "rpc: malformed message (tensor size overflows)");
  CHECK(tableErrorOf(tableOf(-1, {1}), 0) == "rpc: malformed message (dtype)");
  CHECK(tableErrorOf(tableOf(kFloat, std::vector<int64_t>(wire::kMaxDims + 1, 1)), 4) ==
        "rpc: malformed message (too many dimensions)");
  CHECK(tableErrorOf(tableOf(kFloat, {2, 3}).substr(0, 10), 24) == "rpc: malformed message (truncated)");
  Writer many;
  many.pod(uint32_t{wire::kMaxTensors + 1});
  CHECK_THAT(tableErrorOf(many.out(), 0), Catch::StartsWith("rpc: malformed message (65537 tensors"));
}

TEST_CASE("a body that refers to a missing tensor or nests too deep is refused", "[rpc][unit]") {
  std::vector<at::Tensor> none;
  Writer bad_index;
  bad_index.pod(uint8_t{5});  // the tensor tag
  bad_index.pod(uint32_t{0});
  bad_index.pod(int64_t{-1});
  Reader in(bad_index.out().data(), bad_index.out().size());
  MessageDecoder dec{in, none, 0, -1};
  CHECK_THROWS_WITH(dec.value(), "rpc: malformed message (tensor index)");

  Writer deep;
  for (int i = 0; i < 70; ++i) {
    deep.pod(uint8_t{6});  // a list of one
    deep.pod(uint32_t{1});
  }
  deep.pod(uint8_t{0});
  Reader in2(deep.out().data(), deep.out().size());
  MessageDecoder dec2{in2, none, 0, -1};
  CHECK_THROWS_WITH(dec2.value(), "rpc: malformed message (nesting too deep)");
}
