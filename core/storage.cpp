#include "core/storage.h"

#include "core/allocator.h"
#include "core/error.h"

namespace weft {

StorageImpl::StorageImpl(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) { allocate(nbytes); }

StorageImpl::StorageImpl(void* data, size_t nbytes, Device device,
                         std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), owned_(false), deleter_(std::move(deleter)) {}

StorageImpl::~StorageImpl() { release(); }

void* StorageImpl::data() const {
  WEFT_CHECK(!device_.is_meta(), "a tensor on the meta device ({} bytes) has no data: it was built under "
             "DefaultDeviceGuard(Device::meta()) for deferred initialisation; materialise it first "
             "(nn::materialize(module, device)) or fsdp::fully_shard its module", nbytes_);
  WEFT_CHECK(is_allocated(), "storage of {} bytes on {} has been freed (use after free(); "
             "re-allocate it before reading)", nbytes_, device_.str());
  return data_;
}

void StorageImpl::release() {
  if (!data_) return;
  if (owned_) {
    allocator_for(device_).deallocate(data_, nbytes_);
  } else if (deleter_) {
    deleter_(data_);
  }
  data_ = nullptr;
}

void StorageImpl::free() {
  WEFT_CHECK(owned_, "storage::free: cannot free memory weft does not own");
  release();
}

void StorageImpl::allocate(size_t nbytes) {
  WEFT_CHECK(owned_, "storage::allocate: cannot re-allocate memory weft does not own");
  WEFT_CHECK(nbytes == nbytes_, "storage::allocate: {} bytes for a storage of {}: a re-allocation keeps the size its "
             "views were made for", nbytes, nbytes_);
  if (nbytes > (size_t(1) << 62)) throw OutOfMemoryError(fmt::format("storage: {} bytes is past any memory", nbytes));
  release();
  nbytes_ = nbytes;
  // Meta storage: the meta allocator counts the bytes and hands out an address that is never
  // read (data() refuses meta storage).
  data_ = allocator_for(device_).allocate(nbytes);
}

}  // namespace weft
