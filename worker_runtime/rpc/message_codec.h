// The codec of RPC messages (wire.h's format): encoding values (none, bool, int, double,
// string, tensor, list, RRef) into a message ready for one gathering write, checking the
// tensor table of an arriving message before anything is allocated, and decoding values
// from its body once its tensors have been read.
//
// A message's metadata is a tensor table (count, then dtype, rank and sizes of each
// tensor) followed by the body (tagged values that refer to tensors by index); the
// tensors' bytes follow the metadata back to back. Encoding an RRef counts the receiver's
// new reference (rref.cc's forkRRef) and decoding one adopts it; a tensor that requires
// grad inside a distributed-autograd context is recorded as a send or receive
// (dist_autograd.cc). Everything else is pure.
//
// Thread-safety: an encoder or decoder is used by one thread at a time; the functions
// here keep no state of their own.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "worker_runtime/rpc/value.h"
#include "worker_runtime/rpc/wire.h"

namespace ddprun::rpc::detail {

// Appends plain values and length-prefixed strings.
class Writer {
 public:
  template <class T>
  void pod(const T& v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    out_.append(p, sizeof(T));
  }
  void str(const std::string& s) {
    pod(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

// Reads what Writer wrote; throws DdprunError ("malformed message (truncated)") past the end.
class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), end_(data + size) {}
  template <class T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  // Bytes read since `begin` (the pointer this reader was made with).
  size_t consumed(const char* begin) const { return static_cast<size_t>(p_ - begin); }
  std::string str() {
    auto n = pod<uint32_t>();
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }

 private:
  void need(size_t n) const {
    if (static_cast<size_t>(end_ - p_) < n) throw DdprunError("rpc: malformed message (truncated)");
  }
  const char* p_;
  const char* end_;
};

// A message ready for a gathering write: header, meta (tensor table + body), tensor blobs.
struct OutMessage {
  wire::Header header;
  std::string meta;
  std::vector<at::Tensor> tensors;
};

// Who a message goes from and to, and the distributed-autograd context its tensors are
// recorded in (-1: none).
struct EncodeTarget {
  int src;
  int dst;
  int64_t context_id;
};

// Builds one message: the caller writes its fixed fields into `body`, then values.
struct MessageEncoder {
  EncodeTarget target;
  Writer table;
  Writer body;
  std::vector<at::Tensor> tensors;

  // Appends `v` to the body. Throws DdprunError for what cannot be sent (a CUDA or sparse
  // tensor, an Object); an RRef adds the receiver's reference first (may block on a call
  // to its owner).
  void value(const Value& v);
  // The finished message. Throws DdprunError when the metadata is over wire::kMaxMetaBytes.
  OutMessage finish(wire::Kind kind, uint64_t id, uint8_t flags = 0);
};

// Decodes values from a message body whose tensors have been read into `tensors`.
struct MessageDecoder {
  Reader& in;
  std::vector<at::Tensor>& tensors;
  int src;
  int64_t context_id;
  // The next value. Throws DdprunError on a malformed body.
  Value value(int depth = 0);
};

// One parsed entry of a message's tensor table.
struct TensorSpec {
  c10::ScalarType dtype;
  std::vector<int64_t> sizes;
  uint64_t bytes = 0;
};

// Checks a message's whole tensor table (count, dtypes, dimensions, byte total against
// `tensor_bytes` from the header) before any tensor is allocated. Returns the specs and
// sets `body_offset` to where the body starts in `meta`. Throws DdprunError
// ("rpc: malformed message (...)") on any violation.
std::vector<TensorSpec> parseTensorTable(const std::string& meta, uint64_t tensor_bytes, size_t& body_offset);

}  // namespace ddprun::rpc::detail
