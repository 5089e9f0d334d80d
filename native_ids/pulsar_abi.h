// The part of pulsar-client-cpp 4.x's public C++ API this extension calls (include/pulsar/Message.h and
// MessageId.h of 4.2.0, the version pulsar-client 3.13 bundles), declared here because no package registry
// ships those headers. Each class must keep the layout of the real one (one std::shared_ptr to its Impl) and
// the same mangled names: pybind11 finds pulsar-client's registered types by typeid name, and the calls bind
// to the symbols pulsar-client's bundled libpulsar exports. The real headers of a newer pulsar-client-cpp
// must be compared with this one before the extension is allowed to load against it (see _check in ids.cpp's
// Python side: native_ids/loader.py).
#pragma once

#include <cstdint>
#include <memory>

namespace pulsar {

class MessageIdImpl;
class MessageImpl;

class __attribute__((visibility("default"))) MessageId {
   public:
    int64_t ledgerId() const;
    int64_t entryId() const;
    int32_t batchIndex() const;
    int32_t partition() const;
    int32_t batchSize() const;

   private:
    std::shared_ptr<MessageIdImpl> impl_;
};

class __attribute__((visibility("default"))) Message {
   public:
    const MessageId& getMessageId() const;
    int getRedeliveryCount() const;

   private:
    std::shared_ptr<MessageImpl> impl_;
};

}  // namespace pulsar
