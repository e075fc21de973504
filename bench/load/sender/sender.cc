// The load tool's compiled sender: one worker's share of a gRPC load run (bench/load/native.py).
//
// The Python sender spends ~0.2 ms of CPU per call in grpc's Python layer; this one sends the
// same prepared messages through grpc++'s generic stub and one completion queue, for a third
// to a half of that, so the server keeps more of the cores it shares with the load tool.
//
//   load-sender JOB REQUESTS OUT
//
// JOB: `key value` lines (bench/load/native.py writes them). REQUESTS: each serialized
// message as a 4-byte little-endian length and its bytes. On stdout: `ready` once every
// channel is connected (or `error <why>` and exit 1); then it waits for `go <start, seconds
// since the epoch>` on stdin (end of input: abort), sends, prints `progress <answered>` every
// 100 ms, stops sending early on a `stop` line, writes the calls to OUT (layout in
// write_out) and prints `done`; at the end of its input (the worker gone) it exits at once.

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <absl/synchronization/mutex.h>
#include <malloc.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Job {
  std::string target, method;
  std::vector<std::pair<std::string, std::string>> metadata;
  double timeout = 0;  // seconds; 0: no deadline
  double connect_timeout = 10;
  int connections = 1;
  double rps = 0;  // 0: closed loop
  double duration = 0;  // 0: none
  int64_t count = -1;  // open: the run's last index + 1; closed: this worker's share (-1: none)
  int64_t offset = 0, stride = 1;
  int64_t concurrency = 0;  // closed: clients; open: the most in flight (0: no limit)
  bool inspect = false;
};

Job read_job(const char* path) {
  Job job;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    std::string rest;
    std::getline(fields >> std::ws, rest);
    if (key == "target") job.target = rest;
    else if (key == "method") job.method = rest;
    else if (key == "timeout") job.timeout = std::stod(rest);
    else if (key == "connect_timeout") job.connect_timeout = std::stod(rest);
    else if (key == "connections") job.connections = std::stoi(rest);
    else if (key == "rps") job.rps = std::stod(rest);
    else if (key == "duration") job.duration = std::stod(rest);
    else if (key == "count") job.count = std::stoll(rest);
    else if (key == "offset") job.offset = std::stoll(rest);
    else if (key == "stride") job.stride = std::stoll(rest);
    else if (key == "concurrency") job.concurrency = std::stoll(rest);
    else if (key == "inspect") job.inspect = rest == "1";
    else if (key == "metadata") {
      auto tab = rest.find('\t');
      job.metadata.emplace_back(rest.substr(0, tab), rest.substr(tab + 1));
    }
  }
  return job;
}

std::vector<grpc::ByteBuffer> read_requests(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<grpc::ByteBuffer> out;
  uint32_t size;
  while (in.read(reinterpret_cast<char*>(&size), 4)) {
    std::string data(size, '\0');
    in.read(data.data(), size);
    grpc::Slice slice(data);
    out.emplace_back(&slice, 1);
  }
  return out;
}

// Protobuf's wire format, only as far as the answer's flags need it.
bool varint(const uint8_t*& p, const uint8_t* end, uint64_t& value) {
  value = 0;
  for (int shift = 0; p < end && shift < 64; shift += 7) {
    uint8_t byte = *p++;
    value |= uint64_t(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return true;
  }
  return false;
}

// Calls `field(number, wire_type, start, end)` for each field of a message; false if malformed.
template <typename F>
bool fields(const uint8_t* p, const uint8_t* end, F field) {
  while (p < end) {
    uint64_t tag, length;
    if (!varint(p, end, tag)) return false;
    const uint8_t* start = p;
    switch (tag & 7) {
      case 0: if (!varint(p, end, length)) return false; break;
      case 1: p += 8; break;
      case 2:
        if (!varint(p, end, length) || length > uint64_t(end - p)) return false;
        start = p;
        p += length;
        break;
      case 5: p += 4; break;
      default: return false;
    }
    if (p > end) return false;
    field(tag >> 3, tag & 7, start, p);
  }
  return true;
}

// 1 if the v2 ModelInferResponse says strata.degraded, 2 if strata.cached (bool parameters).
int flags_of(const std::string& reply) {
  auto begin = reinterpret_cast<const uint8_t*>(reply.data());
  int flags = 0;
  fields(begin, begin + reply.size(), [&](uint64_t number, int type, auto start, auto stop) {
    if (number != 4 || type != 2) return;  // parameters: map<string, InferParameter>
    std::string key;
    bool value = false;
    fields(start, stop, [&](uint64_t entry, int entry_type, auto s, auto e) {
      if (entry == 1 && entry_type == 2) key.assign(reinterpret_cast<const char*>(s), e - s);
      if (entry != 2 || entry_type != 2) return;
      fields(s, e, [&](uint64_t choice, int choice_type, auto vs, auto) {
        if (choice == 1 && choice_type == 0) {  // bool_param
          uint64_t v;
          value = varint(vs, e, v) && v != 0;
        }
      });
    });
    if (value && key == "strata.degraded") flags |= 1;
    if (value && key == "strata.cached") flags |= 2;
  });
  return flags;
}

struct Call {
  grpc::ClientContext context;
  grpc::ByteBuffer reply;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
  int64_t due, sent;  // ns from the start (closed loop: due is when sent)
};

struct Calls {
  std::vector<int64_t> due, lag, latency;
  std::vector<int8_t> code, flags;
  std::vector<int32_t> error;
  std::map<std::pair<int, std::string>, int32_t> error_index;
  std::vector<std::pair<int, std::string>> errors;
};

class Sender {
 public:
  Sender(Job job, std::vector<grpc::ByteBuffer> requests)
      : job_(std::move(job)), requests_(std::move(requests)) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one TCP connection per channel
    args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
    args.SetInt(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, 64 << 20);
    for (int k = 0; k < job_.connections; ++k) {
      channels_.push_back(
          grpc::CreateCustomChannel(job_.target, grpc::InsecureChannelCredentials(), args));
      stubs_.emplace_back(channels_.back());
    }
  }

  // Waits for every connection; "" once up, else why not (the words the Python sender uses).
  std::string connect() {
    auto deadline = std::chrono::system_clock::now() +
                    std::chrono::microseconds(int64_t(job_.connect_timeout * 1e6));
    for (auto& channel : channels_) {
      if (channel->WaitForConnected(deadline)) continue;
      if (channel->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE)
        return "connection refused or unreachable";
      return "still CONNECTING";
    }
    return "";
  }

  // Sends from `start` until the plan's end or `stop`; "normal", "timeout" or "cancel".
  std::string run(Clock::time_point start, const std::atomic<bool>& stop) {
    start_ = start;
    std::this_thread::sleep_until(start);
    return job_.rps > 0 ? open_loop(stop) : closed_loop(stop);
  }

  const Calls& calls() const { return calls_; }

 private:
  int64_t now() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count();
  }

  std::string open_loop(const std::atomic<bool>& stop) {
    double period = 1e9 / job_.rps;
    int64_t i = job_.offset, burst = 0;
    std::string reason = job_.duration > 0 ? "timeout" : "normal";  // ghz's "ran for -z"
    while (i < job_.count) {
      if (stop) {
        reason = "cancel";
        break;
      }
      int64_t due = int64_t(double(i) * period);
      bool room = job_.concurrency == 0 || in_flight_ < job_.concurrency;
      if (room && now() >= due) {
        send(i, due);
        i += job_.stride;
        // Behind schedule, calls go out back to back: time what finished meanwhile now, not
        // once the backlog is sent.
        if (++burst % kBurst == 0) poll(0);
        continue;
      }
      // Until the next call is due (or, at the cap, until one finishes), take what finishes.
      int64_t wait = room ? due - now() : kTick;
      poll(std::min(wait, kTick));
    }
    while (in_flight_ > 0) poll(kTick);
    return reason;
  }

  std::string closed_loop(const std::atomic<bool>& stop) {
    int64_t end = job_.duration > 0 ? int64_t(job_.duration * 1e9) : -1;
    int64_t remaining = job_.count;
    int64_t sent = 0;
    std::string reason = "normal";
    auto more = [&]() {
      if (stop) reason = "cancel";
      else if (end >= 0 && now() >= end) reason = "timeout";
      else if (remaining != 0) return true;
      return false;
    };
    auto next = [&]() {
      if (remaining > 0) --remaining;
      int64_t i = job_.offset + sent++ * job_.stride;
      send(i, -1);
    };
    for (int64_t k = 0; k < std::max<int64_t>(job_.concurrency, 1) && more(); ++k) next();
    while (in_flight_ > 0) {
      int finished = poll(kTick);
      for (int k = 0; k < finished && more(); ++k) next();
    }
    return reason;
  }

  // Sends message `i`, due at `due` ns (-1: a closed loop's call, due when sent).
  void send(int64_t i, int64_t due) {
    auto* call = new Call;
    for (auto& [key, value] : job_.metadata) call->context.AddMetadata(key, value);
    if (job_.timeout > 0)
      call->context.set_deadline(std::chrono::system_clock::now() +
                                 std::chrono::nanoseconds(int64_t(job_.timeout * 1e9)));
    // By this worker's own count: every connection takes its turn.
    auto& stub = stubs_[(i / job_.stride) % stubs_.size()];
    call->sent = now();
    call->due = due < 0 ? call->sent : due;
    call->reader = stub.PrepareUnaryCall(&call->context, job_.method,
                                         requests_[i % requests_.size()], &queue_);
    call->reader->StartCall();
    call->reader->Finish(&call->reply, &call->status, call);
    ++in_flight_;
  }

  // Records the calls that finish within `wait_ns`; how many did.
  int poll(int64_t wait_ns) {
    int finished = 0;
    auto deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                 gpr_time_from_nanos(wait_ns, GPR_TIMESPAN));
    // Not "now" for the calls that have already finished: gRPC rounds a deadline up to the
    // next millisecond, so "now" waits up to a millisecond; the distant past does not wait.
    auto past = gpr_inf_past(GPR_CLOCK_MONOTONIC);
    void* tag;
    bool ok;
    while (true) {
      // The first waits until `deadline`; the rest take only what has already finished.
      auto until = finished || wait_ns <= 0 ? past : deadline;
      if (queue_.AsyncNext(&tag, &ok, until) != grpc::CompletionQueue::GOT_EVENT) break;
      record(static_cast<Call*>(tag));
      ++finished;
    }
    progress();
    return finished;
  }

  void record(Call* call) {
    int64_t done = now();
    --in_flight_;
    ++answered_;
    int code = call->status.error_code();
    int flags = 0;
    if (code == 0 && job_.inspect) {
      grpc::Slice slice;
      std::string bytes;
      if (call->reply.TrySingleSlice(&slice).ok()) {
        bytes.assign(reinterpret_cast<const char*>(slice.begin()), slice.size());
      } else {
        std::vector<grpc::Slice> slices;
        call->reply.Dump(&slices);
        for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
      flags = flags_of(bytes);
    }
    int32_t error = -1;
    if (code != 0) {
      auto key = std::make_pair(code, call->status.error_message());
      auto found = calls_.error_index.find(key);
      if (found == calls_.error_index.end()) {
        found = calls_.error_index.emplace(key, int32_t(calls_.errors.size())).first;
        calls_.errors.push_back(key);
      }
      error = found->second;
    }
    calls_.due.push_back(call->due);
    calls_.lag.push_back(call->sent - call->due);
    calls_.latency.push_back(done - call->due);
    calls_.code.push_back(int8_t(code));
    calls_.flags.push_back(int8_t(flags));
    calls_.error.push_back(error);
    delete call;
  }

  void progress() {
    auto t = Clock::now();
    if (t < next_progress_) return;
    next_progress_ = t + std::chrono::milliseconds(100);
    std::printf("progress %lld\n", static_cast<long long>(answered_));
    std::fflush(stdout);
  }

  static constexpr int64_t kTick = 50'000'000;  // ns: the longest wait between checks of stop
  static constexpr int64_t kBurst = 16;  // calls sent back to back between looks at the queue
  Job job_;
  std::vector<grpc::ByteBuffer> requests_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<grpc::GenericStub> stubs_;
  grpc::CompletionQueue queue_;
  Clock::time_point start_, next_progress_;
  int64_t in_flight_ = 0, answered_ = 0;
  Calls calls_;
};

template <typename T>
void put(std::ofstream& out, const std::vector<T>& values) {
  out.write(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

template <typename T>
void put(std::ofstream& out, T value) {
  out.write(reinterpret_cast<const char*>(&value), sizeof(T));
}

// Little-endian: int64 n; due, lag, latency (int64 ns each); code, flags (int8); error (int32,
// -1: none); int32 m, then m errors as int32 code, int32 length, details; double CPU seconds,
// double wall seconds; int32 length, the end reason.
void write_out(const char* path, const Calls& calls, double cpu, double wall,
               const std::string& reason) {
  std::ofstream out(path, std::ios::binary);
  put(out, int64_t(calls.due.size()));
  put(out, calls.due);
  put(out, calls.lag);
  put(out, calls.latency);
  put(out, calls.code);
  put(out, calls.flags);
  put(out, calls.error);
  put(out, int32_t(calls.errors.size()));
  for (auto& [code, details] : calls.errors) {
    put(out, int32_t(code));
    put(out, int32_t(details.size()));
    out.write(details.data(), details.size());
  }
  put(out, cpu);
  put(out, wall);
  put(out, int32_t(reason.size()));
  out.write(reason.data(), reason.size());
}

double cpu_seconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](timeval t) { return double(t.tv_sec) + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's abseil checks every mutex for deadlock cycles, a graph update per lock: a
  // measurable share of each call here.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Each call's context is freed as the next is made: keep the freed memory rather than hand
  // it back to the kernel and fault fresh zeroed pages in for every call.
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s JOB REQUESTS OUT\n", argv[0]);
    return 2;
  }
  Job job = read_job(argv[1]);
  auto requests = read_requests(argv[2]);
  if (requests.empty()) {
    std::printf("error no request messages in %s\n", argv[2]);
    return 1;
  }
  Sender sender(job, std::move(requests));
  std::string why = sender.connect();
  if (!why.empty()) {
    std::printf("error %s\n", why.c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  std::string word;
  double start_epoch;
  if (!(std::cin >> word >> start_epoch) || word != "go") return 0;  // aborted
  std::atomic<bool> stop{false};
  // A `stop` line: stop sending, finish what is in flight. The end of input: the worker is
  // gone and nobody will read the calls, so end now rather than wait out their deadlines.
  std::thread listener([&stop]() {
    std::string line;
    while (std::cin >> line)
      if (line == "stop") stop = true;
    std::_Exit(0);
  });
  listener.detach();
  auto system_now = std::chrono::duration<double>(
      std::chrono::system_clock::now().time_since_epoch()).count();
  auto start = Clock::now() + std::chrono::nanoseconds(int64_t((start_epoch - system_now) * 1e9));
  double cpu = cpu_seconds();
  std::string reason = sender.run(start, stop);
  double wall = std::chrono::duration<double>(Clock::now() - start).count();
  write_out(argv[3], sender.calls(), cpu_seconds() - cpu, wall, reason);
  std::printf("done\n");
  std::fflush(stdout);
  return 0;
}
