#include "worker_runtime/rpc/message_codec.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "worker_runtime/rpc/internal.h"

namespace ddprun::rpc::detail {
namespace {

enum class Tag : uint8_t { kNone, kBool, kInt, kDouble, kString, kTensor, kList, kRRef };

}  // namespace

OutMessage MessageEncoder::finish(wire::Kind kind, uint64_t id, uint8_t flags) {
  OutMessage m;
  m.header.kind = static_cast<uint8_t>(kind);
  m.header.flags = flags;
  m.header.src = target.src;
  m.header.id = id;
  Writer head;
  head.pod(static_cast<uint32_t>(tensors.size()));
  m.meta = std::move(head.out());
  m.meta += table.out();
  m.meta += body.out();
  if (m.meta.size() > wire::kMaxMetaBytes) throw DdprunError("rpc: message metadata over 256 MiB");
  m.header.meta_bytes = static_cast<uint32_t>(m.meta.size());
  uint64_t bytes = 0;
  for (auto& t : tensors) bytes += t.nbytes();
  m.header.tensor_bytes = bytes;
  m.tensors = std::move(tensors);
  return m;
}

void MessageEncoder::value(const Value& v) {
  const auto& s = v.storage();
  switch (s.index()) {
    case 0: body.pod(Tag::kNone); break;
    case 1:
      body.pod(Tag::kBool);
      body.pod(static_cast<uint8_t>(std::get<bool>(s)));
      break;
    case 2:
      body.pod(Tag::kInt);
      body.pod(std::get<int64_t>(s));
      break;
    case 3:
      body.pod(Tag::kDouble);
      body.pod(std::get<double>(s));
      break;
    case 4:
      body.pod(Tag::kString);
      body.str(std::get<std::string>(s));
      break;
    case 5: {
      const at::Tensor& t = std::get<at::Tensor>(s);
      if (!t.defined()) {
        body.pod(Tag::kNone);
        break;
      }
      if (t.is_sparse()) throw DdprunError("rpc: sparse tensors cannot be sent");
      int64_t send_id = -1;
      if (target.context_id >= 0 && t.requires_grad()) {
        // Its gradient would come back as a CPU tensor to a send recorded on the device.
        if (!t.device().is_cpu()) {
          throw DdprunError(
              fmt::format("rpc: a {} tensor that requires grad cannot be sent inside a distributed "
                          "autograd context; send t.cpu() (the copy is differentiable)",
                          t.device().str()));
        }
        send_id = recordSend(target.context_id, target.dst, t);
      }
      // Contiguous tensors go out from their own storage; others through one
      // copy. A device tensor goes as a CPU copy and arrives on the CPU, where TensorPipe
      // would need a device map.
      at::Tensor data = t.device().is_cpu() ? t.detach() : t.detach().to(at::kCPU);
      if (!data.is_contiguous()) data = data.contiguous();
      body.pod(Tag::kTensor);
      body.pod(static_cast<uint32_t>(tensors.size()));
      body.pod(send_id);
      table.pod(static_cast<int8_t>(data.scalar_type()));
      table.pod(static_cast<uint8_t>(data.dim()));
      for (auto d : data.sizes()) table.pod(static_cast<int64_t>(d));
      tensors.push_back(std::move(data));
      break;
    }
    case 6: {
      const auto& list = std::get<Value::List>(s);
      body.pod(Tag::kList);
      body.pod(static_cast<uint32_t>(list.size()));
      for (const auto& e : list) value(e);
      break;
    }
    case 7: {
      const auto& st = std::get<std::shared_ptr<RRefState>>(s);
      forkRRef(*st, target.dst);
      body.pod(Tag::kRRef);
      body.pod(static_cast<int32_t>(st->owner));
      body.pod(st->creator);
      body.pod(st->serial);
      break;
    }
    case 8:
      throw DdprunError("rpc: a " + std::get<std::shared_ptr<Object>>(s)->typeName() +
                        " lives on its owner and cannot be sent (use an RRef)");
  }
}

Value MessageDecoder::value(int depth) {
  if (depth > 64) throw DdprunError("rpc: malformed message (nesting too deep)");
  switch (in.pod<Tag>()) {
    case Tag::kNone: return {};
    case Tag::kBool: return Value(in.pod<uint8_t>() != 0);
    case Tag::kInt: return Value(in.pod<int64_t>());
    case Tag::kDouble: return Value(in.pod<double>());
    case Tag::kString: return Value(in.str());
    case Tag::kTensor: {
      auto index = in.pod<uint32_t>();
      auto send_id = in.pod<int64_t>();
      if (index >= tensors.size()) throw DdprunError("rpc: malformed message (tensor index)");
      at::Tensor t = tensors[index];
      if (send_id >= 0 && context_id >= 0) t = recordRecv(context_id, src, send_id, std::move(t));
      return Value(std::move(t));
    }
    case Tag::kList: {
      auto n = in.pod<uint32_t>();
      Value::List list;
      list.reserve(std::min<uint32_t>(n, 1 << 16));
      for (uint32_t i = 0; i < n; ++i) list.push_back(value(depth + 1));
      return Value(std::move(list));
    }
    case Tag::kRRef: {
      auto owner = in.pod<int32_t>();
      auto creator = in.pod<int64_t>();
      auto serial = in.pod<int64_t>();
      return Value(RRef(adoptRRef(owner, creator, serial, src)));
    }
  }
  throw DdprunError("rpc: malformed message (unknown value tag)");
}

std::vector<TensorSpec> parseTensorTable(const std::string& meta, uint64_t tensor_bytes, size_t& body_offset) {
  std::vector<TensorSpec> specs;
  Reader in(meta.data(), meta.size());
  const auto count = in.pod<uint32_t>();
  if (count > wire::kMaxTensors) {
    throw DdprunError(fmt::format("rpc: malformed message ({} tensors, at most {})", count, wire::kMaxTensors));
  }
  uint64_t total = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const auto dtype = in.pod<int8_t>();
    const auto ndim = in.pod<uint8_t>();
    if (dtype < 0 || dtype >= static_cast<int8_t>(c10::ScalarType::NumOptions)) {
      throw DdprunError("rpc: malformed message (dtype)");
    }
    if (ndim > wire::kMaxDims) throw DdprunError("rpc: malformed message (too many dimensions)");
    TensorSpec spec{static_cast<c10::ScalarType>(dtype), std::vector<int64_t>(ndim), 0};
    uint64_t bytes = c10::elementSize(spec.dtype);
    for (auto& d : spec.sizes) {
      d = in.pod<int64_t>();
      if (d < 0) throw DdprunError("rpc: malformed message (negative size)");
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
        throw DdprunError("rpc: malformed message (tensor size overflows)");
      }
    }
    spec.bytes = bytes;
    if (__builtin_add_overflow(total, bytes, &total)) throw DdprunError("rpc: malformed message (tensor bytes)");
    specs.push_back(std::move(spec));
  }
  body_offset = in.consumed(meta.data());  // the body starts where the tensor table ends
  if (total != tensor_bytes) throw DdprunError("rpc: malformed message (tensor bytes)");
  return specs;
}

}  // namespace ddprun::rpc::detail
