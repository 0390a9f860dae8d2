// What every unary call of the edge's services goes through, Broker and Admin alike: counted in
// flight (for a graceful shutdown), timed, recorded in the service's stats table, logged when it
// fails (rate-limited), and finished exactly once, on the handler's thread or, for a call that
// may wait, on a BlockingExecutor thread so gRPC's callback threads never block.
#pragma once

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <optional>
#include <utility>

#include "common/status.h"
#include "daemon/edge/blocking_executor.h"
#include "daemon/edge/grpc_status.h"
#include "daemon/edge/rate_limit.h"
#include "daemon/edge/rpc_stats.h"

namespace ibvx::daemon {

template <typename M>
class CallRecorder {
  public:
    explicit CallRecorder(BasicRpcStats<M> &stats) : stats_(stats) {}
    CallRecorder(const CallRecorder &) = delete;
    CallRecorder &operator=(const CallRecorder &) = delete;

    // One call from its start to its reply. Cheap to copy (a blocking task carries it); finish()
    // must be called once, by whichever copy ends the call.
    class Call {
      public:
        grpc::ServerUnaryReactor *reactor() const { return reactor_; }

        grpc::ServerUnaryReactor *finish(const Status &st, uint64_t session_id = 0) const {
            grpc::Status reply = toGrpc(st);
            const auto now = std::chrono::steady_clock::now();
            recorder_->stats_.record(method_, static_cast<int>(reply.error_code()), now - start_, session_id);
            recorder_->last_finish_ns_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
            if (!st.isOk()) {
                recorder_->logFailure(ctx_, method_, st);
            }
            grpc::ServerUnaryReactor *reactor = reactor_;
            reactor->Finish(reply);
            --recorder_->inflight_;
            return reactor;
        }

      private:
        friend class CallRecorder;
        Call(CallRecorder *recorder, grpc::CallbackServerContext *ctx, M method)
            : recorder_(recorder),
              ctx_(ctx),
              method_(method),
              start_(std::chrono::steady_clock::now()),
              reactor_(ctx->DefaultReactor()) {}

        CallRecorder *recorder_;
        grpc::CallbackServerContext *ctx_;
        M method_;
        std::chrono::steady_clock::time_point start_;
        grpc::ServerUnaryReactor *reactor_;
    };

    Call begin(grpc::CallbackServerContext *ctx, M method) {
        ++inflight_;
        return Call(this, ctx, method);
    }

    // Runs fn() (a Status) on ex and finishes the call from there; the handler returns at once.
    // fn must own or copy what it uses: the handler's locals are gone when it runs.
    template <typename Fn>
    grpc::ServerUnaryReactor *finishOn(BlockingExecutor &ex, const Call &call, Fn fn,
                                       uint64_t session_id = 0) {
        grpc::ServerUnaryReactor *reactor = call.reactor();
        // fn's captures (a session's reference, say) are dropped before the reply leaves: a
        // client that sees the answer and ends its session must find nothing of it still held here.
        auto task = [call, fn = std::optional<Fn>(std::move(fn)), session_id]() mutable {
            Status st = (*fn)();
            fn.reset();
            call.finish(std::move(st), session_id);
        };
        if (!ex.submit(std::move(task))) {
            return call.finish(
                Status(Code::kUnavailable, EAGAIN, "the broker has too many waiting calls; retry later"),
                session_id);
        }
        return reactor;
    }

    // Calls currently between begin() and finish().
    int inflight() const { return inflight_.load(); }
    // When the last call was finished (its reply handed to gRPC); the epoch when none was.
    std::chrono::steady_clock::time_point lastFinish() const {
        return std::chrono::steady_clock::time_point(
            std::chrono::steady_clock::duration(last_finish_ns_.load(std::memory_order_relaxed)));
    }

  private:
    void logFailure(grpc::CallbackServerContext *ctx, M method, const Status &st) {
        uint64_t suppressed = 0;
        if (error_log_.allow(&suppressed)) {
            spdlog::info("{} from {} failed: {}{}", methodName(method), ctx->peer(), st.toString(),
                         suppressed != 0 ? fmt::format(" ({} similar lines suppressed)", suppressed) : "");
        }
    }

    BasicRpcStats<M> &stats_;
    RateLimiter error_log_{20};
    std::atomic<int> inflight_{0};
    std::atomic<std::chrono::steady_clock::rep> last_finish_ns_{0};
};

}  // namespace ibvx::daemon
