// core: a block of device memory shared by a tensor and its views. It can be freed and re-allocated in place, so FSDP
// can drop an unsharded parameter's memory while autograd still holds the tensor object, and bring it back before the
// next use. Storage on the meta device has a size but no memory: reading its data is an error that says to materialise;
// it may carry the deferred fill (core/fill_rule.h) that gives its values.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>

#include "device.h"

namespace weft {

struct FillRule;

class StorageImpl {
 public:
  StorageImpl(size_t nbytes, Device device);
  // Wraps memory owned elsewhere; `deleter` (may be empty) runs when the storage dies.
  StorageImpl(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  ~StorageImpl();
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  void* data() const;  // throws if the storage has been freed
  void* data_or_null() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool is_allocated() const { return data_ != nullptr || nbytes_ == 0; }

  void free();                   // releases the memory; views keep their geometry
  void allocate(size_t nbytes);  // (re)allocates uninitialised memory in place: nbytes must be nbytes()

  // Counts the in-place writes through the public API (copy_, fill_, uniform_, normal_, an
  // optimizer's step): autograd refuses a backward that would read an input changed since.
  uint64_t version = 0;

  // Meta storage only: how its elements are to be computed (null: never filled).
  const std::shared_ptr<const FillRule>& deferred_fill() const { return deferred_fill_; }
  void set_deferred_fill(std::shared_ptr<const FillRule> rule) { deferred_fill_ = std::move(rule); }

 private:
  void release();
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  bool owned_ = true;
  std::function<void(void*)> deleter_;
  std::shared_ptr<const FillRule> deferred_fill_;
};

using Storage = std::shared_ptr<StorageImpl>;

}  // namespace weft
