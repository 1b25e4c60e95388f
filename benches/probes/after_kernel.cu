// Probe (not project code): does a process's first kernel launch slow its later small
// copies, and which part of them? Session 69 (run 1, benches/into_then_h2d.rs) found every
// thread's blocking 1 KiB H2D through pinlane about 1.1 us slower for the rest of the
// process once any thread had launched a kernel (8.8 to 9.0 us, then 9.9 to 10.1). Here,
// with nothing of pinlane or torch, one thread times the pieces of a 1 KiB copy each way
// (its submission, its synchronisation, the whole, and the whole ending on a flag the
// stream writes into page-locked memory, as pinlane's D2H does) in phases: fresh, fresh
// again (drift), after a module is loaded (no launch), after one launch of an empty
// kernel, after 1000 more.
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o after_kernel after_kernel.cu -lcuda && ./after_kernel
// Medians (us) of 2000 timed iterations after 200 warm-up ones per row; the empty kernel
// comes from PTX loaded with cuModuleLoadData (no runtime API call is made).
// Results: benches/results/issue20_session69/ (runs 2 to 5, this file's successive forms;
// its README). The first form (the first line of each phase) found only "event"
// (cuEventRecord + cuEventSynchronize on an idle stream) slower after a launch (0.74 us,
// then 1.86 to 1.97); the second line of each phase (`events`) times the event calls one
// by one, and the two whole-call shapes that use them: a D2H ordered after another stream
// by an event or by asking that stream (cuStreamQuery), and an H2D that records a slot's
// event after its copy (as pinlane's staged H2D does). The third line (`pieces`) is
// pinlane's whole H2D sequence.
#include <cuda.h>
#include <immintrin.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
#include "probe.h"

static const char* kPtx =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry empty()\n{\n\tret;\n}\n";

static double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
static double med(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Env {
  CUstream s;
  void* pinned;
  CUdeviceptr d;
  volatile uint32_t* flag;
  CUdeviceptr flag_d;
  uint32_t seq;
  CUevent ev;
  CUevent timed;
  CUstream other;
};

static void spin(Env& e);
static void pieces(Env& e);

// Times the event calls alone and two whole-call shapes: one line after `name`.
static void events(const char* name, Env& e) {
  const int warm = 200, reps = 2000;
  const size_t n = 1024;
  std::vector<double> rec(reps), rect(reps), q(reps), sy(reps), w(reps), sq(reps), dev(reps),
      dq(reps), hev(reps), hno(reps);
  for (int pass = 0; pass < 2; pass++) {
    int count = pass == 0 ? warm : reps;
    for (int i = 0; i < count; i++) {
      bool keep = pass == 1;
      double t0 = now_us();
      CK(cuEventRecord(e.ev, e.s));
      double t1 = now_us();
      CK(cuEventRecord(e.timed, e.s));
      double t2 = now_us();
      CK(cuStreamSynchronize(e.s));
      double t3 = now_us();
      (void)cuEventQuery(e.ev);
      double t4 = now_us();
      CK(cuEventSynchronize(e.ev));
      double t5 = now_us();
      CK(cuStreamWaitEvent(e.other, e.ev, 0));
      double t6 = now_us();
      (void)cuStreamQuery(e.other);
      double t7 = now_us();
      CK(cuStreamSynchronize(e.other));
      // D2H ordered after `other` by an event, ending on the flag.
      double t8 = now_us();
      CK(cuEventRecord(e.ev, e.other));
      CK(cuStreamWaitEvent(e.s, e.ev, 0));
      e.seq++;
      CK(cuMemcpyDtoHAsync(e.pinned, e.d, n, e.s));
      CK(cuStreamWriteValue32(e.s, e.flag_d, e.seq, 0));
      spin(e);
      double t9 = now_us();
      // The same, ordered by asking `other` (idle: no event needed).
      if (cuStreamQuery(e.other) != CUDA_SUCCESS) {
        CK(cuEventRecord(e.ev, e.other));
        CK(cuStreamWaitEvent(e.s, e.ev, 0));
      }
      e.seq++;
      CK(cuMemcpyDtoHAsync(e.pinned, e.d, n, e.s));
      CK(cuStreamWriteValue32(e.s, e.flag_d, e.seq, 0));
      spin(e);
      double t10 = now_us();
      // H2D with a slot's event recorded after the copy, then the stream synchronised.
      CK(cuMemcpyHtoDAsync(e.d, e.pinned, n, e.s));
      CK(cuEventRecord(e.ev, e.s));
      CK(cuStreamSynchronize(e.s));
      double t11 = now_us();
      CK(cuMemcpyHtoDAsync(e.d, e.pinned, n, e.s));
      CK(cuStreamSynchronize(e.s));
      double t12 = now_us();
      if (keep) {
        rec[i] = t1 - t0, rect[i] = t2 - t1, q[i] = t4 - t3, sy[i] = t5 - t4, w[i] = t6 - t5;
        sq[i] = t7 - t6, dev[i] = t9 - t8, dq[i] = t10 - t9, hev[i] = t11 - t10, hno[i] = t12 - t11;
      }
    }
  }
  printf("%-26s record %5.2f (timing %5.2f) query %5.2f sync %5.2f wait %5.2f streamq %5.2f | "
         "D2H by event %5.2f by query %5.2f | H2D+record %5.2f H2D %5.2f\n",
         "", med(rec), med(rect), med(q), med(sy), med(w), med(sq), med(dev), med(dq), med(hev),
         med(hno));
  (void)name;
  fflush(stdout);
}

static void spin(Env& e) { spin_flag(e.flag, e.seq); }

// One phase: every row, printed on one line after `name`.
static void phase(const char* name, Env& e) {
  const int warm = 200, reps = 2000;
  const size_t n = 1024;
  std::vector<double> hs(reps), hy(reps), hw(reps), hf(reps), ds(reps), dy(reps), dw(reps),
      df(reps), idle(reps), evs(reps);
  for (int pass = 0; pass < 2; pass++) {
    int count = pass == 0 ? warm : reps;
    for (int i = 0; i < count; i++) {
      bool keep = pass == 1;
      double t0 = now_us();
      CK(cuMemcpyHtoDAsync(e.d, e.pinned, n, e.s));
      double t1 = now_us();
      CK(cuStreamSynchronize(e.s));
      double t2 = now_us();
      e.seq++;
      CK(cuMemcpyHtoDAsync(e.d, e.pinned, n, e.s));
      CK(cuStreamWriteValue32(e.s, e.flag_d, e.seq, 0));
      spin(e);
      double t3 = now_us();
      CK(cuMemcpyDtoHAsync(e.pinned, e.d, n, e.s));
      double t4 = now_us();
      CK(cuStreamSynchronize(e.s));
      double t5 = now_us();
      e.seq++;
      CK(cuMemcpyDtoHAsync(e.pinned, e.d, n, e.s));
      CK(cuStreamWriteValue32(e.s, e.flag_d, e.seq, 0));
      spin(e);
      double t6 = now_us();
      CK(cuStreamSynchronize(e.s));
      double t7 = now_us();
      CK(cuEventRecord(e.ev, e.s));
      CK(cuEventSynchronize(e.ev));
      double t8 = now_us();
      if (keep) {
        hs[i] = t1 - t0, hy[i] = t2 - t1, hw[i] = t2 - t0, hf[i] = t3 - t2;
        ds[i] = t4 - t3, dy[i] = t5 - t4, dw[i] = t5 - t3, df[i] = t6 - t5;
        idle[i] = t7 - t6, evs[i] = t8 - t7;
      }
    }
  }
  printf("%-26s H2D submit %5.2f sync %5.2f whole %5.2f flag %5.2f | D2H submit %5.2f sync %5.2f "
         "whole %5.2f flag %5.2f | idle sync %5.2f event %5.2f\n",
         name, med(hs), med(hy), med(hw), med(hf), med(ds), med(dy), med(dw), med(df), med(idle),
         med(evs));
  fflush(stdout);
  events(name, e);
  pieces(e);
}

// Pinlane's blocking 1 KiB H2D as the driver sees it (the simulator's trace of one call):
// the context pushed, a pool allocation on the copy stream, the copy, the slot's event,
// the synchronisation, the previous call's output freed in order on the consumer stream
// (by default the legacy stream), the context popped. An earlier form, with the free on
// the copy stream and the default pool, was not slower after a launch (run 4); here the
// free goes on the legacy stream (pinlane's default) or the copy stream, and the
// allocation inside the sequence is timed alone. A pool of its own, freed memory kept
// (as pinlane's). It ends with cuCtxSynchronize, which (run 5) brings the queries back to
// their speed before a launch.
static void pieces(Env& e) {
  const int warm = 200, reps = 2000;
  const size_t n = 1024;
  CUcontext ctx;
  CK(cuCtxGetCurrent(&ctx));
  CUdevice dev;
  CK(cuCtxGetDevice(&dev));
  static CUmemoryPool pool = nullptr;
  if (!pool) {
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev;
    CK(cuMemPoolCreate(&pool, &props));
    cuuint64_t keep_all = ~0ull;
    CK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
  }
  for (int legacy = 1; legacy >= 0; legacy--) {
    CUstream fs = legacy ? CU_STREAM_LEGACY : e.s;
    std::vector<double> al(reps), whole(reps);
    CUdeviceptr prev = 0;
    for (int pass = 0; pass < 2; pass++) {
      int count = pass == 0 ? warm : reps;
      for (int i = 0; i < count; i++) {
        double t0 = now_us();
        CUcontext c;
        CK(cuCtxGetCurrent(&c));
        CK(cuCtxPushCurrent(ctx));
        CUdeviceptr p;
        double a0 = now_us();
        CK(cuMemAllocFromPoolAsync(&p, n, pool, e.s));
        double a1 = now_us();
        CK(cuMemcpyHtoDAsync(p, e.pinned, n, e.s));
        CK(cuEventRecord(e.ev, e.s));
        CK(cuStreamSynchronize(e.s));
        if (prev) CK(cuMemFreeAsync(prev, fs));
        prev = p;
        CK(cuCtxPopCurrent(&c));
        double t1 = now_us();
        if (pass == 1) al[i] = a1 - a0, whole[i] = t1 - t0;
      }
    }
    CK(cuMemFreeAsync(prev, fs));
    CK(cuCtxSynchronize());
    printf("%-26s output freed on the %s stream: whole %5.2f, its allocation %5.2f\n", "",
           legacy ? "legacy" : "copy", med(whole), med(al));
  }
  fflush(stdout);
}

int main() {
  CUdevice dev = primary_device0();
  (void)dev;
  Env e{};
  CK(cuStreamCreate(&e.s, CU_STREAM_NON_BLOCKING));
  CK(cuEventCreate(&e.ev, CU_EVENT_DISABLE_TIMING));
  CK(cuEventCreate(&e.timed, CU_EVENT_DEFAULT));
  CK(cuStreamCreate(&e.other, CU_STREAM_NON_BLOCKING));
  CK(cuMemHostAlloc(&e.pinned, 1 << 20, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  memset(e.pinned, 3, 1 << 20);
  void* f;
  CK(cuMemHostAlloc(&f, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  e.flag = (volatile uint32_t*)f;
  *e.flag = 0;
  CK(cuMemHostGetDevicePointer(&e.flag_d, f, 0));
  CK(cuMemAlloc(&e.d, 1 << 20));
  printf("1 KiB copies, one thread, a non-blocking stream, the primary context; medians of 2000, us\n");
  phase("fresh", e);
  phase("fresh, again", e);
  CUmodule m;
  CUfunction k;
  CK(cuModuleLoadData(&m, kPtx));
  CK(cuModuleGetFunction(&k, m, "empty"));
  phase("module loaded, no launch", e);
  CUstream ks;
  CK(cuStreamCreate(&ks, CU_STREAM_NON_BLOCKING));
  CK(cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, ks, nullptr, nullptr));
  CK(cuStreamSynchronize(ks));
  phase("one launch (other stream)", e);
  phase("again", e);
  for (int i = 0; i < 1000; i++) CK(cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, ks, nullptr, nullptr));
  CK(cuStreamSynchronize(ks));
  phase("1000 more launches", e);
  CK(cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, e.s, nullptr, nullptr));
  CK(cuStreamSynchronize(e.s));
  phase("a launch on this stream", e);
  return 0;
}
