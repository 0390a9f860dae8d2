// A unary callback method's request and response made on one protobuf arena whose first block
// sits in the holder itself: one allocation a call for both messages and everything in them.
// gRPC's default holder news both messages, and every sub-message, string and repeated field of
// a call then has its own malloc and free: a CreateQp's reply alone carries two QueueInfos and
// four RegionRefs (issue 25: malloc and free were the largest share of a mutating call's broker
// instructions).
#pragma once

#include <google/protobuf/arena.h>
#include <grpcpp/support/message_allocator.h>

#include <cstddef>
#include <type_traits>

namespace ibvx::daemon {

template <typename Req, typename Resp>
class ArenaMessages final : public grpc::MessageAllocator<Req, Resp> {
  public:
    grpc::MessageHolder<Req, Resp> *AllocateMessages() override { return new Holder; }

  private:
    class Holder final : public grpc::MessageHolder<Req, Resp> {
      public:
        Holder() : arena_(options()) {
            this->set_request(google::protobuf::Arena::CreateMessage<Req>(&arena_));
            this->set_response(google::protobuf::Arena::CreateMessage<Resp>(&arena_));
        }
        void Release() override { delete this; }

      private:
        // Larger calls (a device list, a QP's full attributes) grow the arena by malloc'd blocks.
        static constexpr size_t kInline = 2048;
        google::protobuf::ArenaOptions options() {
            google::protobuf::ArenaOptions o;
            o.initial_block = block_;
            o.initial_block_size = sizeof(block_);
            return o;
        }
        alignas(std::max_align_t) char block_[kInline];
        google::protobuf::Arena arena_;  // after block_: made from it, destroyed before it
    };
};

// Sets the arena allocator on a callback service's method: the generated
// SetMessageAllocatorFor_<Method>, named by its member pointer so the request and response types
// come from it. The allocator lives as long as the process (gRPC requires it to outlive the
// server).
template <typename Base, typename Req, typename Resp>
void useArenaMessages(void (Base::*set)(grpc::MessageAllocator<Req, Resp> *),
                      std::type_identity_t<Base> *service) {
    static ArenaMessages<Req, Resp> allocator;
    (service->*set)(&allocator);
}

}  // namespace ibvx::daemon
