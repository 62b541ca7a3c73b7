/*
 * Mycroft NCCL profiler plugin: one core behind thin adapters for profiler API v4, v5
 * and v6 (NCCL 2.27 to 2.30).
 *
 * Why it is built this way:
 * - NCCL calls startEvent / stopEvent / recordEventState from its user and proxy
 *   threads on the critical path of every collective. Those calls only touch
 *   per-communicator preallocated pools with C11 atomics: no locks, no allocation,
 *   no syscalls (the only clock read is a raw counter read - rdtsc - on Coll /
 *   ProxyOp / KernelCh boundaries, converted to ns by the publisher; ProxyStep calls
 *   read no clock at all).
 * - Each flow (ProxyOp) keeps Mycroft's cumulative counters: posted, GPU-ready,
 *   transmitted, done, bumped from the ProxyStep states. A step handle is a slot in
 *   its flow's own step array (step % 16; NCCL keeps at most 8 steps in flight), so
 *   ProxyStep events allocate nothing.
 * - A background publisher thread scans the pools every few milliseconds, writes a
 *   completion record for what finished and, every snapshot interval, a snapshot of
 *   everything in flight, into a single-producer shared-memory ring. When the ring is
 *   full it drops and counts: NCCL is never made to wait.
 * - A collective only completes when its last ProxyOp / KernelCh stops (NCCL's stop of
 *   the Coll event means "enqueued"); children may start after that stop, so a
 *   collective is retired only after it has been quiet for a linger period.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mycroft_ring.h"
#include "nccl_profiler_abi.h"

#define MC_EXPORT __attribute__((visibility("default")))
#define MC_LIKELY(x) __builtin_expect(!!(x), 1)
#define MC_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Test builds only (make hooks: -DMC_TEST_HOOKS): a callback at points where another thread
 * could interleave, so a test can force an interleaving deterministically. Production builds
 * compile the hook points to nothing. */
enum { MC_HOOK_CHILD_VALIDATED = 1 }; /* child_parent: parent checked, child not yet counted */
#ifdef MC_TEST_HOOKS
typedef void (*mc_test_hook_t)(int point, void* obj);
static mc_test_hook_t mc_test_hook;
#define MC_TEST_HOOK(point, obj) \
  do {                           \
    if (mc_test_hook) mc_test_hook((point), (obj)); \
  } while (0)
#else
#define MC_TEST_HOOK(point, obj) ((void)0)
#endif

#define MC_MAX_STEPS 16u /* power of two, > NCCL_STEPS (8) */
#define MC_ALLOC_PROBES 32u

enum { T_COLL = 1, T_P2P = 2, T_FLOW = 3, T_KCH = 4, T_STEP = 5, T_PHASE = 6, T_OVF = 7, T_PAIR = 8 };
/* slot states: FREE -> BUSY (claimed, being filled) -> ACTIVE -> STOPPED -> FREE */
enum { S_FREE = 0, S_BUSY = 1, S_ACTIVE = 2, S_STOPPED = 3 };
enum { SEEN_G = 1, SEEN_T = 2, SEEN_D = 4 };
#define MC_PHASES 3 /* v7 kernel phases: initial_sync, compute, final_sync */

struct mc_ctx;
struct mc_flow;
struct mc_kch;

/* Every handle Mycroft gives NCCL starts with the same 16 bytes: its type (byte 0) and, at
 * byte 8, the chained plugin's handle for the same event (NULL when nothing is chained). */
#define MC_CHAIN(h) (*(void**)((char*)(h) + 8))

typedef struct mc_parent { /* a Coll, P2p or CeColl event */
  uint8_t type;
  _Atomic uint32_t state;
  void* chain;
  struct mc_ctx* ctx;
  uint64_t seq;
  uint64_t count;
  int32_t root_or_peer;
  uint8_t nchannels, nwarps;
  uint8_t expect; /* 1: a child (flow / kernel channel) must be seen before the op can be done */
  uint8_t is_sym;
  uint16_t flags; /* MC_FLAG_SYM, MC_FLAG_CE */
  char func[14], algo[14], dtype[14], proto[6];
  uint64_t user_tag;  /* v7 */
  char variant[56];   /* v7 kernelVariant, "" when none */
  uint64_t start_t; /* hot-path timestamps are clock ticks (mc_ticks); the publisher converts */
  _Atomic uint64_t stop_t;
  _Atomic uint64_t children; /* MC_CH_*: open children, children seen, the slot's generation (one word) */
  _Atomic uint64_t last_activity_t;
  _Atomic uint64_t end_t; /* max over children stops */
  /* publisher-private */
  uint64_t last_snapshot_ns;
} mc_parent_t;

/* mc_parent_t.children is one word, so that counting a child and retiring the collective exclude
 * each other (a child counted against a slot the publisher has just freed would be wiped by the
 * next occupant's start, and its stop would then underflow that collective's count):
 *   bits  0-23  children open (bounded by the flow + kernel-channel pools, <= 2^21)
 *   bits 24-47  children seen (saturating)
 *   bits 48-63  the slot's generation: odd while a collective holds the slot (set by its start),
 *               even once the publisher retired it (its CAS needs no open child)
 * A child takes the generation with its first load, checks the slot is live, and counts itself
 * with a CAS that only succeeds on that generation: if the collective was retired (or the slot
 * retired and reused) in between, the child is an orphan and the slot's occupant is untouched. */
#define MC_CH_OPEN 0xffffffull
#define MC_CH_SEEN_ONE (1ull << 24)
#define MC_CH_SEEN (0xffffffull << 24)
#define MC_CH_GEN_SHIFT 48
#define MC_CH_GEN_ONE (1ull << MC_CH_GEN_SHIFT)
#define MC_CH_GEN (0xffffull << MC_CH_GEN_SHIFT)
static inline uint32_t ch_open(uint64_t c) { return (uint32_t)(c & MC_CH_OPEN); }
static inline uint32_t ch_seen(uint64_t c) { return (uint32_t)((c & MC_CH_SEEN) >> 24); }

typedef struct mc_step {
  uint8_t type;
  uint8_t seen;
  uint16_t pad;
  uint32_t step;
  void* chain;
  struct mc_flow* flow;
} mc_step_t;

typedef struct mc_phase { /* a v7 KernelPhase: a slot of its kernel channel, like a step of its flow */
  uint8_t type;
  uint8_t id;
  uint16_t pad0;
  uint32_t pad1;
  void* chain;
  struct mc_kch* kch;
} mc_phase_t;

typedef struct mc_flow { /* a ProxyOp */
  uint8_t type;
  _Atomic uint32_t state;
  void* chain;
  struct mc_ctx* ctx;
  mc_parent_t* parent; /* NULL when orphan */
  uint64_t seq;
  uint16_t parent_kind;
  uint16_t flags;
  int32_t rank, channel, peer, nsteps, chunk;
  uint8_t is_send;
  int32_t pid;
  uint32_t uid;
  uint32_t gen; /* bumped on every reuse of the slot (by its claimer) */
  uint64_t start_t; /* ticks */
  uint64_t stop_t;  /* ticks, written before STOPPED (release) */
  _Atomic uint32_t posted, gpu_ready, transmitted, done;
  _Atomic uint64_t bytes;
  _Atomic uint32_t last_state, cur_step;
  /* publisher-private */
  uint64_t progress_sum;
  uint64_t progress_ns;
  mc_step_t steps[MC_MAX_STEPS];
} mc_flow_t;

typedef struct mc_kch { /* a KernelCh */
  uint8_t type;
  _Atomic uint32_t state;
  void* chain;
  struct mc_ctx* ctx;
  mc_parent_t* parent;
  uint64_t seq;
  uint16_t parent_kind;
  uint16_t flags;
  int32_t rank, channel;
  uint32_t uid, gen;
  uint64_t start_t, stop_t; /* ticks */
  uint64_t gpu_start;
  _Atomic uint64_t gpu_stop;
  /* v7 phases: written by the thread that runs the channel's events, read after STOPPED */
  uint8_t phase_mask;
  uint64_t phase_ts[MC_PHASES + 1];
  mc_phase_t phases[MC_PHASES];
} mc_kch_t;

typedef struct mc_pair { /* chaining: an event only the chained plugin keeps (or ours was dropped) */
  uint8_t type;
  _Atomic uint32_t state;
  void* chain;
  uint64_t stop_t; /* ticks; freed by the publisher a grace period after its stop */
} mc_pair_t;

_Static_assert(offsetof(mc_parent_t, chain) == 8 && offsetof(mc_step_t, chain) == 8, "chain slot");
_Static_assert(offsetof(mc_flow_t, chain) == 8 && offsetof(mc_kch_t, chain) == 8, "chain slot");
_Static_assert(offsetof(mc_phase_t, chain) == 8 && offsetof(mc_pair_t, chain) == 8, "chain slot");

typedef struct mc_ctx {
  uint64_t comm_hash;
  int32_t rank, nranks, nnodes, version;
  char name[56];
  uint32_t ncolls, nflows, nkchs, npairs; /* powers of two */
  mc_parent_t* colls;
  mc_flow_t* flows;
  mc_kch_t* kchs;
  mc_pair_t* pairs; /* only when a plugin is chained */
  mc_parent_t overflow; /* handed out when the coll pool is full, so NCCL still starts the children (#1544) */
  _Atomic uint32_t* p2p_seq; /* [nranks][2]: per peer, per direction */
  _Atomic uint32_t coll_cursor, flow_cursor, kch_cursor, pair_cursor;
  uint32_t colls_with_children; /* publisher-only: retired collectives that had a flow / kernel channel */
  uint64_t kch_done_start[256]; /* publisher-only: per channel, the latest start of a kernel channel that stopped */
  void* chain_ctx; /* the chained plugin's context for this communicator */
  struct mc_ctx* next;
} mc_ctx_t;

#define MC_MAX_CTX 256u
static _Atomic(mc_ctx_t*) live_ctx[MC_MAX_CTX]; /* contexts we created, compared by address only */
static _Atomic uint32_t live_ctx_n;             /* high-water mark of live_ctx */

/* the chained profiler plugin (MYCROFT_NCCL_PROFILER_CHAIN) */
static struct {
  void* lib;
  int version; /* of the table used: the highest the plugin exports <= the version NCCL calls us with */
  const mcNcclProfiler_v4_t* t4;
  const mcNcclProfiler_v7_t* t7; /* v5, v6 and v7 tables share one layout; typed as v7 */
  _Atomic int mask; /* the event mask its init asked for (set at init, read on the hot path) */
  int tried;
  char name[64];
} chain;

static struct {
  pthread_mutex_t lock; /* ctx list, ring writes, publisher lifecycle: never on the hot path */
  mc_ctx_t* live;
  int nlive;
  mc_ring_header_t* ring;
  mc_record_t* records;
  size_t ring_bytes;
  uint32_t cap;
  char ring_path[512];
  pthread_t thread;
  int thread_running;
  _Atomic uint64_t run_gen; /* the publisher runs while this equals the value it was started with */
  uint64_t snapshot_ns, linger_ns, tick_ns, last_snapshot_ns, child_wait_ns, pair_grace_ns;
  uint32_t pool_colls, pool_flows, pool_kchs, pool_pairs;
  _Atomic int mask; /* the events Mycroft keeps (read on the hot path, relaxed) */
  int mask_version; /* the profiler version g.mask was chosen for */
  pid_t pid;
  mcNcclDebugLogger_t log;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* ------------------------------------------------------------------------------------ */
/* small helpers                                                                          */
/* ------------------------------------------------------------------------------------ */
static inline uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts); /* vDSO: no syscall with the tsc clocksource */
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t real_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------------------ */
/* the hot-path clock                                                                     */
/* ------------------------------------------------------------------------------------ */
/* Hot-path timestamps are raw counter ticks: the TSC on x86-64, the virtual counter on
 * aarch64, read in a few ns (clock_gettime through the vDSO costs ~25-40 ns: a fenced
 * counter read, a seqlock and the conversion). They are used only where the kernel itself
 * trusts the counter (current clocksource "tsc" / "arch_sys_counter": invariant and in sync
 * across CPUs); otherwise, or with MYCROFT_NATIVE_CLOCK=monotonic, ticks are
 * CLOCK_MONOTONIC ns. Only the publisher converts ticks to ns, under g.lock, with a
 * piecewise-linear map it extends as it goes: each recalibration starts a new segment at
 * the previous segment's value (continuous, monotonic) with a slope that also slews out the
 * drift seen so far. A tick is converted by the segment it falls in, so the same tick gives
 * the same ns in every publish cycle (a flow and its collective published in different
 * cycles stay consistent). Recalibration: 10 ms, 100 ms, 1 s after start, then every second. */
typedef struct {
  uint64_t t0;   /* first tick of the segment */
  uint64_t ns0;  /* CLOCK_MONOTONIC ns at t0 */
  uint64_t mult; /* ns per tick, 32.32 fixed point */
} mc_seg_t;

#define MC_SEGS 128u /* segments kept (about 2 minutes at one per second); older ticks use the oldest */

static struct {
  int counter;   /* 1: ticks are counter reads; 0: ticks are CLOCK_MONOTONIC ns */
  uint32_t nseg; /* segments made so far (the ring holds the last MC_SEGS) */
  mc_seg_t seg[MC_SEGS];
  uint64_t cal_t, cal_ns;  /* the last calibration pair */
  uint64_t next_cal_ns;    /* when to recalibrate */
  uint64_t cal_interval_ns;
  uint32_t recalibrations;
} clk;

static inline uint64_t counter_read(void) {
#if defined(__x86_64__) || defined(__i386__)
  uint32_t lo, hi;
  __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
  return ((uint64_t)hi << 32) | lo;
#elif defined(__aarch64__)
  uint64_t v;
  __asm__ volatile("mrs %0, cntvct_el0" : "=r"(v));
  return v;
#else
  return 0;
#endif
}

static inline uint64_t mc_ticks(void) {
  if (MC_LIKELY(clk.counter)) return counter_read();
  return mono_ns();
}

/* A (tick, ns) pair read back to back: the tick is the midpoint of two counter reads around
 * the clock read, best of a few tries (a preemption between the reads would skew the pair). */
static void clock_pair(uint64_t* t, uint64_t* ns) {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < 8; i++) {
    uint64_t a = counter_read();
    uint64_t n = mono_ns();
    uint64_t b = counter_read();
    if (b >= a && b - a < best) {
      best = b - a;
      *t = a + (b - a) / 2;
      *ns = n;
    }
  }
}

static int kernel_trusts_counter(void) {
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
  char cs[64] = {0};
  FILE* f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  if (!f) return 0;
  int ok = fgets(cs, sizeof cs, f) != NULL;
  fclose(f);
  if (!ok) return 0;
  return !strncmp(cs, "tsc", 3) || !strncmp(cs, "arch_sys_counter", 16);
#else
  return 0;
#endif
}

static uint64_t seg_convert(const mc_seg_t* sg, uint64_t t) {
  int64_t dt = (int64_t)(t - sg->t0);
  __int128 d = ((__int128)dt * (__int128)sg->mult) >> 32;
  return (uint64_t)((__int128)sg->ns0 + d);
}

/* ticks -> CLOCK_MONOTONIC ns (publisher only, under g.lock); 0 stays 0 */
static uint64_t ticks_to_ns(uint64_t t) {
  if (!t) return 0;
  if (!clk.counter) return t;
  uint32_t n = clk.nseg < MC_SEGS ? clk.nseg : MC_SEGS;
  for (uint32_t i = 0; i < n; i++) { /* newest first: nearly every tick is recent */
    const mc_seg_t* sg = &clk.seg[(clk.nseg - 1 - i) % MC_SEGS];
    if (t >= sg->t0 || i == n - 1) return seg_convert(sg, t);
  }
  return t;
}

static void clock_init(void) {
  const char* want = getenv("MYCROFT_NATIVE_CLOCK");
  clk.counter = (!want || strcmp(want, "monotonic")) && kernel_trusts_counter();
  if (!clk.counter) return;
  uint64_t t0, n0, t1, n1;
  clock_pair(&t0, &n0);
  do { /* a provisional rate from a 2 ms spin (NCCL's communicator init takes far longer) */
    clock_pair(&t1, &n1);
  } while (n1 - n0 < 2000000ull);
  if (t1 <= t0) {
    clk.counter = 0;
    return;
  }
  uint64_t mult = (uint64_t)(((__int128)(n1 - n0) << 32) / (t1 - t0));
  clk.seg[0] = (mc_seg_t){t1, n1, mult};
  clk.nseg = 1;
  clk.cal_t = t1;
  clk.cal_ns = n1;
  clk.cal_interval_ns = 10000000ull; /* 10 ms, then 100 ms, 1 s, 1 s ... */
  clk.next_cal_ns = n1 + clk.cal_interval_ns;
}

/* Publisher (under g.lock): start a new segment when it is time. */
static void clock_maybe_recalibrate(uint64_t now_ns) {
  if (!clk.counter || now_ns < clk.next_cal_ns) return;
  uint64_t t, n;
  clock_pair(&t, &n);
  if (t <= clk.cal_t || n <= clk.cal_ns) return;
  /* the rate over the whole span since the last calibration, then a slew that removes the
   * error of the current map (n - predicted) over the next interval */
  __int128 rate = ((__int128)(n - clk.cal_ns) << 32) / (__int128)(t - clk.cal_t);
  uint64_t predicted = ticks_to_ns(t);
  uint64_t next = clk.cal_interval_ns < 1000000000ull ? clk.cal_interval_ns * 10 : 1000000000ull;
  int64_t err = (int64_t)(n - predicted);
  int64_t bound = (int64_t)(next / 2); /* the slope stays within 50 % of the measured rate: positive */
  if (err > bound) err = bound;
  if (err < -bound) err = -bound;
  __int128 mult = rate * (__int128)((int64_t)next + err) / (__int128)next;
  if (mult <= 0) return;
  clk.seg[clk.nseg % MC_SEGS] = (mc_seg_t){t, predicted, (uint64_t)mult};
  clk.nseg++;
  clk.recalibrations++;
  clk.cal_t = t;
  clk.cal_ns = n;
  clk.cal_interval_ns = next;
  clk.next_cal_ns = n + next;
}

/* single-writer counter bump: a relaxed load + store, no locked RMW on the hot path */
static inline void bump32(_Atomic uint32_t* c) {
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
}

static inline void copy_fixed(char* dst, size_t n, const char* src) {
  size_t i = 0;
  if (src)
    for (; i < n && src[i]; i++) dst[i] = src[i];
  for (; i < n; i++) dst[i] = 0;
}

static uint32_t pow2_at_least(uint64_t v, uint32_t lo, uint32_t hi) {
  uint32_t p = lo;
  while (p < v && p < hi) p <<= 1;
  return p;
}

static uint64_t env_u64(const char* name, uint64_t dflt, uint64_t lo, uint64_t hi) {
  const char* s = getenv(name);
  if (!s || !*s) return dflt;
  char* end = NULL;
  unsigned long long v = strtoull(s, &end, 0);
  if (end == s) return dflt;
  if (v < lo) v = lo;
  if (v > hi) v = hi;
  return v;
}

static void plog(int level, const char* fmt, const char* arg) {
  if (g.log) g.log(level, MC_NCCL_LOG_PROFILE_FLAG, __FILE__, __LINE__, fmt, arg);
}

static inline void count_dropped_event(void) {
  if (g.ring) atomic_fetch_add_explicit(&g.ring->dropped_events, 1, memory_order_relaxed);
}

static inline void count_foreign_event(void) {
  if (g.ring) atomic_fetch_add_explicit(&g.ring->foreign_events, 1, memory_order_relaxed);
}

static inline void count_chain_dropped(void) {
  if (g.ring) atomic_fetch_add_explicit(&g.ring->chain_dropped, 1, memory_order_relaxed);
}

/* Claim a FREE slot: FREE -> BUSY with one CAS, a few probes from a shared cursor. */
#define MC_POOL_ALLOC(pool, n, cursor, out)                                                          \
  do {                                                                                               \
    (out) = NULL;                                                                                    \
    for (uint32_t probe_ = 0; probe_ < MC_ALLOC_PROBES; probe_++) {                                  \
      uint32_t i_ = atomic_fetch_add_explicit(&(cursor), 1, memory_order_relaxed) & ((n) - 1);       \
      uint32_t exp_ = S_FREE;                                                                        \
      if (atomic_load_explicit(&(pool)[i_].state, memory_order_relaxed) == S_FREE &&                 \
          atomic_compare_exchange_strong_explicit(&(pool)[i_].state, &exp_, S_BUSY,                  \
                                                  memory_order_acquire, memory_order_relaxed)) {     \
        (out) = &(pool)[i_];                                                                         \
        break;                                                                                       \
      }                                                                                              \
    }                                                                                                \
  } while (0)

/* ------------------------------------------------------------------------------------ */
/* hot path                                                                               */
/* ------------------------------------------------------------------------------------ */
static inline int parent_live(const mc_parent_t* p) {
  uint32_t s = atomic_load_explicit(&p->state, memory_order_acquire);
  return s == S_ACTIVE || s == S_STOPPED;
}

static void* start_parent(mc_ctx_t* ctx, int type, uint64_t seq, const char* func, size_t count, const char* dtype,
                          int root_or_peer, uint8_t nch, uint8_t nwarps, const char* algo, const char* proto,
                          uint16_t flags, uint64_t user_tag, const char* variant) {
  mc_parent_t* p;
  MC_POOL_ALLOC(ctx->colls, ctx->ncolls, ctx->coll_cursor, p);
  if (MC_UNLIKELY(!p)) {
    count_dropped_event();
    /* not NULL: NCCL would then start none of its children (#1544); under the sentinel they
     * still come, as orphans, with their counters */
    return &ctx->overflow;
  }
  uint64_t now = mc_ticks();
  p->type = (uint8_t)type;
  p->chain = NULL;
  p->ctx = ctx;
  p->seq = seq;
  p->count = count;
  p->root_or_peer = root_or_peer;
  p->nchannels = nch;
  p->nwarps = nwarps;
  p->flags = flags;
  /* NCCL stops a Coll at enqueue; its kernel may start much later (queued behind other work
   * on the stream), so its children can come long after the stop: see publish_ctx. A
   * copy-engine collective has no children. */
  p->expect = !(flags & MC_FLAG_CE) && ctx->nranks > 1 &&
              (atomic_load_explicit(&g.mask, memory_order_relaxed) & (MC_EV_KERNEL_CH | MC_EV_PROXY_OP));
  copy_fixed(p->func, sizeof p->func, func);
  copy_fixed(p->algo, sizeof p->algo, algo);
  copy_fixed(p->dtype, sizeof p->dtype, dtype);
  copy_fixed(p->proto, sizeof p->proto, proto);
  p->user_tag = user_tag;
  if (MC_UNLIKELY(variant != NULL))
    copy_fixed(p->variant, sizeof p->variant, variant);
  else
    p->variant[0] = 0;
  p->start_t = now;
  p->last_snapshot_ns = now;
  atomic_store_explicit(&p->stop_t, 0, memory_order_relaxed);
  /* a new generation (odd: held), no child open or seen. Release: a child that loads this
   * generation also sees the previous occupant's retirement, so it cannot take that one's
   * state for this one's. The slot is ours (BUSY): children only CAS an odd generation
   * they loaded, and the previous one was retired (even), so nothing else writes here. */
  uint64_t gen = ((atomic_load_explicit(&p->children, memory_order_relaxed) >> MC_CH_GEN_SHIFT) + 1) | 1;
  atomic_store_explicit(&p->children, gen << MC_CH_GEN_SHIFT, memory_order_release);
  atomic_store_explicit(&p->last_activity_t, now, memory_order_relaxed);
  atomic_store_explicit(&p->end_t, 0, memory_order_relaxed);
  atomic_store_explicit(&p->state, S_ACTIVE, memory_order_release);
  return p;
}

/* Whether p points into one of this communicator's pools (by address: nothing is read). A
 * parent NCCL passes from another process (a PXN task handle) is not, and is never read. */
#define MC_IN(p, base, n) ((const char*)(p) >= (const char*)(base) && (const char*)(p) < (const char*)((base) + (n)))
static inline int owned(const mc_ctx_t* ctx, const void* p) {
  return MC_IN(p, ctx->colls, ctx->ncolls) || MC_IN(p, ctx->flows, ctx->nflows) || MC_IN(p, ctx->kchs, ctx->nkchs) ||
         (ctx->pairs && MC_IN(p, ctx->pairs, ctx->npairs)) || p == (const void*)&ctx->overflow;
}

/* Resolve a child's parentObj: NULL, not ours, a retired slot or a foreign type make it an
 * orphan. The parent is claimed by its generation (see MC_CH_*): the seq read here belongs to
 * the collective the child is counted against, and a collective retired between the check and
 * the count is never counted against (nor is its slot's next occupant). */
static inline mc_parent_t* child_parent(const mc_ctx_t* ctx, void* parentObj, uint64_t now, uint64_t* seq,
                                        uint16_t* kind) {
  mc_parent_t* p = (mc_parent_t*)parentObj;
  *seq = UINT64_MAX;
  *kind = 0;
  if (!p || !MC_IN(p, ctx->colls, ctx->ncolls)) return NULL;
  uint64_t c = atomic_load_explicit(&p->children, memory_order_acquire);
  const uint64_t gen = c & MC_CH_GEN;
  if (!(gen & MC_CH_GEN_ONE) || !parent_live(p) || (p->type != T_COLL && p->type != T_P2P)) return NULL;
  uint64_t pseq = p->seq;
  uint16_t pkind = p->type == T_COLL ? MC_REC_COLL_DONE : MC_REC_P2P_DONE;
  MC_TEST_HOOK(MC_HOOK_CHILD_VALIDATED, p);
  for (;;) { /* only fails while other children of the same collective count themselves */
    if ((c & MC_CH_GEN) != gen) return NULL; /* retired (and maybe reused) since the check */
    uint64_t next = c + 1 + ((c & MC_CH_SEEN) == MC_CH_SEEN ? 0 : MC_CH_SEEN_ONE);
    if (atomic_compare_exchange_weak_explicit(&p->children, &c, next, memory_order_acq_rel, memory_order_acquire))
      break;
  }
  *seq = pseq;
  *kind = pkind;
  atomic_store_explicit(&p->last_activity_t, now, memory_order_relaxed);
  return p;
}

static inline void child_done(mc_parent_t* p, uint64_t now) {
  if (!p) return;
  /* atomic max, lock-free: children may stop on different proxy threads, and a lost update
   * would end the collective before its last flow */
  uint64_t cur = atomic_load_explicit(&p->end_t, memory_order_relaxed);
  while (cur < now &&
         !atomic_compare_exchange_weak_explicit(&p->end_t, &cur, now, memory_order_relaxed, memory_order_relaxed)) {
  }
  atomic_store_explicit(&p->last_activity_t, now, memory_order_relaxed);
  atomic_fetch_sub_explicit(&p->children, 1, memory_order_acq_rel);
}

static void* start_flow(mc_ctx_t* ctx, void* parentObj, int rank, pid_t pid, int channel, int peer, int nsteps,
                        int chunk, int is_send) {
  mc_flow_t* f;
  MC_POOL_ALLOC(ctx->flows, ctx->nflows, ctx->flow_cursor, f);
  if (MC_UNLIKELY(!f)) {
    count_dropped_event();
    return NULL;
  }
  uint64_t now = mc_ticks();
  uint16_t flags = 0;
  if (pid != g.pid) { /* PXN: parentObj lives in another process: never dereference it */
    parentObj = NULL;
    flags |= MC_FLAG_PXN;
  }
  f->type = T_FLOW;
  f->chain = NULL;
  f->ctx = ctx;
  f->parent = child_parent(ctx, parentObj, now, &f->seq, &f->parent_kind);
  if (!f->parent) flags |= MC_FLAG_ORPHAN;
  f->flags = flags;
  f->rank = rank;
  f->channel = channel;
  f->peer = peer;
  f->nsteps = nsteps;
  f->chunk = chunk;
  f->is_send = is_send ? 1 : 0;
  f->pid = pid;
  /* unique while in flight (the slot), and over time (the slot's generation): no shared counter */
  f->uid = ++f->gen * ctx->nflows + (uint32_t)(f - ctx->flows);
  f->start_t = now;
  f->stop_t = 0;
  atomic_store_explicit(&f->posted, 0, memory_order_relaxed);
  atomic_store_explicit(&f->gpu_ready, 0, memory_order_relaxed);
  atomic_store_explicit(&f->transmitted, 0, memory_order_relaxed);
  atomic_store_explicit(&f->done, 0, memory_order_relaxed);
  atomic_store_explicit(&f->bytes, 0, memory_order_relaxed);
  atomic_store_explicit(&f->last_state, 0, memory_order_relaxed);
  atomic_store_explicit(&f->cur_step, 0, memory_order_relaxed);
  f->progress_sum = 0;
  f->progress_ns = now;
  atomic_store_explicit(&f->state, S_ACTIVE, memory_order_release);
  return f;
}

static void* start_kch(mc_ctx_t* ctx, void* parentObj, int rank, int channel, uint64_t ptimer) {
  mc_kch_t* k;
  MC_POOL_ALLOC(ctx->kchs, ctx->nkchs, ctx->kch_cursor, k);
  if (MC_UNLIKELY(!k)) {
    count_dropped_event();
    return NULL;
  }
  uint64_t now = mc_ticks();
  k->type = T_KCH;
  k->chain = NULL;
  k->ctx = ctx;
  k->phase_mask = 0;
  k->parent = child_parent(ctx, parentObj, now, &k->seq, &k->parent_kind);
  k->flags = k->parent ? 0 : MC_FLAG_ORPHAN;
  k->rank = rank;
  k->channel = channel;
  k->uid = ++k->gen * ctx->nkchs + (uint32_t)(k - ctx->kchs);
  k->start_t = now;
  k->stop_t = 0;
  k->gpu_start = ptimer;
  atomic_store_explicit(&k->gpu_stop, 0, memory_order_relaxed);
  atomic_store_explicit(&k->state, S_ACTIVE, memory_order_release);
  return k;
}

static inline void* start_step(void* parentObj, int step) {
  mc_flow_t* f = (mc_flow_t*)parentObj;
  if (MC_UNLIKELY(!f || f->type != T_FLOW)) return NULL;
  mc_step_t* s = &f->steps[(uint32_t)step & (MC_MAX_STEPS - 1)];
  s->type = T_STEP;
  s->chain = NULL;
  s->seen = 0;
  s->step = (uint32_t)step;
  s->flow = f;
  bump32(&f->posted);
  return s;
}

/* A v7 KernelPhase: NCCL starts, records (KernelPhaseStop) and stops it in one go, while
 * its kernel channel is still open (the channel stops after its phases). */
static void* start_phase(void* parentObj, int id, uint64_t ptimer) {
  mc_kch_t* k = (mc_kch_t*)parentObj;
  if (MC_UNLIKELY(!k || k->type != T_KCH || id < 0 || id >= MC_PHASES)) return NULL;
  if (atomic_load_explicit(&k->state, memory_order_acquire) != S_ACTIVE) return NULL;
  mc_phase_t* ph = &k->phases[id];
  ph->type = T_PHASE;
  ph->id = (uint8_t)id;
  ph->chain = NULL;
  ph->kch = k;
  k->phase_ts[id] = ptimer;
  return ph;
}

static inline void step_mark(mc_step_t* s, mc_flow_t* f, uint8_t bits) {
  uint8_t missing = (uint8_t)(bits & ~s->seen);
  if (!missing) return;
  s->seen |= missing;
  if (missing & SEEN_G) bump32(&f->gpu_ready);
  if (missing & SEEN_T) bump32(&f->transmitted);
  if (missing & SEEN_D) bump32(&f->done);
}

static inline void record_step(mc_step_t* s, int state, const mcNcclProfilerEventStateArgs_v4_t* a) {
  mc_flow_t* f = s->flow;
  switch (state) {
    case MC_ST_STEP_SEND_PEER_WAIT_V4: /* data is on the GPU-side buffer: GPU-ready */
    case MC_ST_STEP_RECV_WAIT:         /* receive posted: the receiver is ready */
      step_mark(s, f, SEEN_G);
      break;
    case MC_ST_STEP_SEND_WAIT:       /* posted to the network */
    case MC_ST_STEP_RECV_FLUSH_WAIT: /* data arrived */
      step_mark(s, f, SEEN_G | SEEN_T);
      if (a)
        atomic_store_explicit(&f->bytes, atomic_load_explicit(&f->bytes, memory_order_relaxed) + a->proxyStep.transSize,
                              memory_order_relaxed);
      break;
    case MC_ST_STEP_RECV_GPU_WAIT:
      step_mark(s, f, SEEN_G | SEEN_T);
      break;
    default: /* SendGPUWait and anything else: only remembered as the last state */
      break;
  }
  atomic_store_explicit(&f->last_state, (uint32_t)state, memory_order_relaxed);
  atomic_store_explicit(&f->cur_step, s->step, memory_order_relaxed);
}

#define MC_INLINE static inline __attribute__((always_inline))
MC_INLINE mcNcclResult_t core_stop(void* h) {
  if (MC_UNLIKELY(!h)) return mcNcclSuccess;
  switch (*(const uint8_t*)h) {
    case T_STEP: {
      mc_step_t* s = (mc_step_t*)h;
      step_mark(s, s->flow, SEEN_G | SEEN_T | SEEN_D);
      return mcNcclSuccess;
    }
    case T_FLOW: {
      mc_flow_t* f = (mc_flow_t*)h;
      if (atomic_load_explicit(&f->state, memory_order_relaxed) != S_ACTIVE) return mcNcclSuccess;
      uint64_t now = mc_ticks();
      f->stop_t = now;
      child_done(f->parent, now);
      atomic_store_explicit(&f->state, S_STOPPED, memory_order_release);
      return mcNcclSuccess;
    }
    case T_KCH: {
      mc_kch_t* k = (mc_kch_t*)h;
      /* claimed by CAS: the publisher may retire a stale channel (its stop never came) */
      uint32_t exp = S_ACTIVE;
      if (!atomic_compare_exchange_strong_explicit(&k->state, &exp, S_BUSY, memory_order_acq_rel,
                                                   memory_order_relaxed))
        return mcNcclSuccess;
      uint64_t now = mc_ticks();
      k->stop_t = now;
      child_done(k->parent, now);
      atomic_store_explicit(&k->state, S_STOPPED, memory_order_release);
      return mcNcclSuccess;
    }
    case T_PHASE: {
      mc_phase_t* ph = (mc_phase_t*)h;
      ph->kch->phase_mask |= (uint8_t)(1u << ph->id);
      return mcNcclSuccess;
    }
    case T_PAIR: {
      mc_pair_t* pr = (mc_pair_t*)h;
      pr->stop_t = mc_ticks();
      atomic_store_explicit(&pr->state, S_STOPPED, memory_order_release);
      return mcNcclSuccess;
    }
    case T_COLL:
    case T_P2P: { /* "enqueued": completion comes from the children */
      mc_parent_t* p = (mc_parent_t*)h;
      uint32_t exp = S_ACTIVE;
      uint64_t now = mc_ticks();
      atomic_store_explicit(&p->stop_t, now, memory_order_relaxed);
      atomic_store_explicit(&p->last_activity_t, now, memory_order_relaxed);
      atomic_compare_exchange_strong_explicit(&p->state, &exp, S_STOPPED, memory_order_release, memory_order_relaxed);
      return mcNcclSuccess;
    }
    default:
      return mcNcclSuccess;
  }
}

MC_INLINE mcNcclResult_t core_record(void* h, int state, const mcNcclProfilerEventStateArgs_v4_t* a) {
  if (MC_UNLIKELY(!h)) return mcNcclSuccess;
  uint8_t type = *(const uint8_t*)h;
  if (MC_LIKELY(type == T_STEP)) {
    record_step((mc_step_t*)h, state, a);
  } else if (type == T_KCH && state == MC_ST_KERNEL_CH_STOP && a) {
    atomic_store_explicit(&((mc_kch_t*)h)->gpu_stop, a->kernelCh.pTimer, memory_order_relaxed);
  } else if (type == T_PHASE && state == MC_ST_KERNEL_PHASE_STOP && a) {
    mc_phase_t* ph = (mc_phase_t*)h;
    ph->kch->phase_ts[ph->id + 1] = a->kernelCh.pTimer;
  }
  return mcNcclSuccess;
}

static uint32_t p2p_next_seq(mc_ctx_t* ctx, int peer, const char* func) {
  if (peer < 0 || peer >= ctx->nranks || !ctx->p2p_seq) return UINT32_MAX;
  int dir = (func && func[0] == 'S') ? 1 : 0; /* "Send" / "Recv" */
  return atomic_fetch_add_explicit(&ctx->p2p_seq[2 * peer + dir], 1, memory_order_relaxed);
}

/* ------------------------------------------------------------------------------------ */
/* ring + publisher (off the hot path, under g.lock)                                      */
/* ------------------------------------------------------------------------------------ */
static void ring_push(mc_record_t* r) {
  mc_ring_header_t* h = g.ring;
  uint64_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
  uint64_t tail = atomic_load_explicit(&h->tail, memory_order_acquire);
  if (head - tail >= g.cap) {
    atomic_fetch_add_explicit(&h->dropped_records, 1, memory_order_relaxed);
    return;
  }
  mc_record_t* slot = &g.records[head & (g.cap - 1)];
  /* index 0 first: a concurrent dump of an already-consumed slot sees it as in progress */
  atomic_store_explicit(&slot->index, 0, memory_order_relaxed);
#ifndef __SANITIZE_THREAD__
  atomic_thread_fence(memory_order_release);
#endif
  memcpy((char*)slot + sizeof(slot->index), (char*)r + sizeof(r->index), sizeof(*r) - sizeof(r->index));
  atomic_store_explicit(&slot->index, head + 1, memory_order_release);
  atomic_store_explicit(&h->head, head + 1, memory_order_release);
  atomic_fetch_add_explicit(&h->total_records, 1, memory_order_relaxed);
}

static inline uint64_t to_real(uint64_t mono, int64_t off) { return mono ? (uint64_t)((int64_t)mono + off) : 0; }

static uint64_t dtype_size(const char* d) {
  /* NCCL datatype names: ncclInt8, ncclUint8, ncclFloat16, ncclBfloat16, ncclFloat8e4m3, ... */
  if (strstr(d, "64")) return 8;
  if (strstr(d, "32")) return 4;
  if (strstr(d, "16")) return 2;
  if (strstr(d, "8")) return 1;
  return 0;
}

/* The v7 facts of a finished collective (tag, kernel variant), just before its record. */
static void emit_info(mc_parent_t* p, int kind, uint64_t now_real) {
  mc_record_t r;
  memset(&r, 0, sizeof r);
  r.kind = MC_REC_COLL_INFO;
  r.flags = p->flags;
  r.rank = p->ctx->rank;
  r.comm_hash = p->ctx->comm_hash;
  r.seq = p->seq;
  r.time_ns = now_real;
  r.u.info.user_tag = p->user_tag;
  r.u.info.parent_kind = (uint16_t)kind;
  r.u.info.is_sym = (p->flags & MC_FLAG_SYM) ? 1 : 0;
  memcpy(r.u.info.kernel_variant, p->variant, sizeof r.u.info.kernel_variant);
  ring_push(&r);
}

static void emit_parent(mc_parent_t* p, int kind, uint16_t flags, int64_t off, uint64_t now_real) {
  if ((kind == MC_REC_COLL_DONE || kind == MC_REC_P2P_DONE) && (p->user_tag || p->variant[0]))
    emit_info(p, kind, now_real);
  mc_record_t r;
  memset(&r, 0, sizeof r);
  r.kind = (uint16_t)kind;
  r.flags = (uint16_t)(flags | p->flags);
  if (atomic_load_explicit(&p->stop_t, memory_order_relaxed)) r.flags |= MC_FLAG_ENQUEUED;
  r.rank = p->ctx->rank;
  r.comm_hash = p->ctx->comm_hash;
  r.seq = p->seq;
  r.start_ns = to_real(ticks_to_ns(p->start_t), off);
  if (kind == MC_REC_COLL_DONE || kind == MC_REC_P2P_DONE) {
    uint64_t end = atomic_load_explicit(&p->end_t, memory_order_relaxed);
    if (!end) end = atomic_load_explicit(&p->stop_t, memory_order_relaxed);
    r.end_ns = to_real(ticks_to_ns(end ? end : p->start_t), off);
  }
  r.time_ns = now_real;
  r.u.coll.count = p->count;
  char dt[15];
  memcpy(dt, p->dtype, 14);
  dt[14] = 0;
  r.u.coll.bytes = p->count * dtype_size(dt);
  r.u.coll.root_or_peer = p->root_or_peer;
  r.u.coll.nchannels = p->nchannels;
  r.u.coll.nwarps = p->nwarps;
  uint32_t total = ch_seen(atomic_load_explicit(&p->children, memory_order_relaxed));
  r.u.coll.nchildren = (uint16_t)(total > 0xffff ? 0xffff : total);
  memcpy(r.u.coll.func, p->func, sizeof p->func);
  memcpy(r.u.coll.algo, p->algo, sizeof p->algo);
  memcpy(r.u.coll.dtype, p->dtype, sizeof p->dtype);
  memcpy(r.u.coll.proto, p->proto, sizeof p->proto);
  ring_push(&r);
}

static void emit_flow(mc_flow_t* f, int kind, uint16_t flags, int64_t off, uint64_t now_real) {
  mc_record_t r;
  memset(&r, 0, sizeof r);
  r.kind = (uint16_t)kind;
  r.flags = (uint16_t)(f->flags | flags);
  r.rank = f->rank;
  r.comm_hash = f->ctx->comm_hash;
  r.seq = f->seq;
  r.start_ns = to_real(ticks_to_ns(f->start_t), off);
  r.end_ns = kind == MC_REC_FLOW_DONE ? to_real(f->stop_t ? ticks_to_ns(f->stop_t) : mono_ns(), off) : 0;
  r.time_ns = now_real;
  mc_rec_flow_t* o = &r.u.flow;
  o->channel = f->channel;
  o->peer = f->peer;
  o->nsteps = f->nsteps;
  o->chunk = f->chunk;
  o->posted = atomic_load_explicit(&f->posted, memory_order_relaxed);
  o->gpu_ready = atomic_load_explicit(&f->gpu_ready, memory_order_relaxed);
  o->transmitted = atomic_load_explicit(&f->transmitted, memory_order_relaxed);
  o->done = atomic_load_explicit(&f->done, memory_order_relaxed);
  o->bytes = atomic_load_explicit(&f->bytes, memory_order_relaxed);
  o->progress_ns = to_real(f->progress_ns, off);
  o->pid = f->pid;
  o->uid = f->uid;
  o->is_send = f->is_send;
  o->last_state = (uint8_t)atomic_load_explicit(&f->last_state, memory_order_relaxed);
  o->cur_step = atomic_load_explicit(&f->cur_step, memory_order_relaxed);
  o->parent_kind = f->parent_kind;
  ring_push(&r);
}

static void emit_kch(mc_kch_t* k, int kind, uint16_t flags, int64_t off, uint64_t now_real) {
  mc_record_t r;
  memset(&r, 0, sizeof r);
  r.kind = (uint16_t)kind;
  r.flags = (uint16_t)(k->flags | flags);
  r.rank = k->rank;
  r.comm_hash = k->ctx->comm_hash;
  r.seq = k->seq;
  r.start_ns = to_real(ticks_to_ns(k->start_t), off);
  if (kind == MC_REC_KCH_DONE)
    r.end_ns = (flags & MC_FLAG_STALE) ? r.start_ns : to_real(k->stop_t ? ticks_to_ns(k->stop_t) : mono_ns(), off);
  if (kind == MC_REC_KCH_DONE && !(flags & (MC_FLAG_ABORTED | MC_FLAG_STALE))) {
    /* phases are complete once the channel stopped (NCCL sends them before its stop) */
    r.u.kch.phase_mask = k->phase_mask;
    for (int i = 0; i <= MC_PHASES; i++) r.u.kch.phase_ts[i] = k->phase_ts[i];
  }
  r.time_ns = now_real;
  r.u.kch.channel = k->channel;
  r.u.kch.uid = k->uid;
  r.u.kch.gpu_start = k->gpu_start;
  r.u.kch.gpu_stop = atomic_load_explicit(&k->gpu_stop, memory_order_relaxed);
  r.u.kch.parent_kind = k->parent_kind;
  ring_push(&r);
}

static void emit_comm(mc_ctx_t* ctx, int kind, uint64_t now_real) {
  mc_record_t r;
  memset(&r, 0, sizeof r);
  r.kind = (uint16_t)kind;
  r.rank = ctx->rank;
  r.comm_hash = ctx->comm_hash;
  r.start_ns = now_real;
  r.time_ns = now_real;
  r.u.comm.nranks = ctx->nranks;
  r.u.comm.nnodes = ctx->nnodes;
  r.u.comm.api_version = (uint32_t)ctx->version;
  memcpy(r.u.comm.name, ctx->name, sizeof r.u.comm.name);
  ring_push(&r);
}

/* One pass over a communicator's pools. abort: finalize is closing it with events open. */
static void publish_ctx(mc_ctx_t* ctx, uint64_t now, int64_t off, uint64_t now_real, int snapshot, int abort) {
  for (uint32_t i = 0; i < ctx->nflows; i++) {
    mc_flow_t* f = &ctx->flows[i];
    uint32_t st = atomic_load_explicit(&f->state, memory_order_acquire);
    if (st == S_ACTIVE) {
      uint64_t sum = (uint64_t)atomic_load_explicit(&f->posted, memory_order_relaxed) +
                     atomic_load_explicit(&f->gpu_ready, memory_order_relaxed) +
                     atomic_load_explicit(&f->transmitted, memory_order_relaxed) +
                     atomic_load_explicit(&f->done, memory_order_relaxed);
      if (sum != f->progress_sum) {
        f->progress_sum = sum;
        f->progress_ns = now;
      }
      if (abort) {
        emit_flow(f, MC_REC_FLOW_DONE, MC_FLAG_ABORTED, off, now_real);
        atomic_store_explicit(&f->state, S_FREE, memory_order_release);
      } else if (snapshot) {
        emit_flow(f, MC_REC_FLOW, 0, off, now_real);
      }
    } else if (st == S_STOPPED) {
      emit_flow(f, MC_REC_FLOW_DONE, 0, off, now_real);
      atomic_store_explicit(&f->state, S_FREE, memory_order_release);
    }
  }
  /* kernel channels: completions first (and, per channel, the latest start among them) */
  for (uint32_t i = 0; i < ctx->nkchs; i++) {
    mc_kch_t* k = &ctx->kchs[i];
    if (atomic_load_explicit(&k->state, memory_order_acquire) != S_STOPPED) continue;
    uint64_t* last = &ctx->kch_done_start[(uint32_t)k->channel & 255u];
    if (k->start_t > *last) *last = k->start_t;
    emit_kch(k, MC_REC_KCH_DONE, 0, off, now_real);
    atomic_store_explicit(&k->state, S_FREE, memory_order_release);
  }
  /* then the open ones: aborted at finalize; stale when a channel that started after it has
   * finished (kernels run in order on a channel: its stop was lost, e.g. delivered before
   * its start, PR #2221); otherwise in flight: a snapshot (intra-node progress evidence) */
  for (uint32_t i = 0; i < ctx->nkchs; i++) {
    mc_kch_t* k = &ctx->kchs[i];
    if (atomic_load_explicit(&k->state, memory_order_acquire) != S_ACTIVE) continue;
    uint64_t start_ns = ticks_to_ns(k->start_t);
    if (abort) {
      emit_kch(k, MC_REC_KCH_DONE, MC_FLAG_ABORTED, off, now_real);
      atomic_store_explicit(&k->state, S_FREE, memory_order_release);
    } else if (k->start_t < ctx->kch_done_start[(uint32_t)k->channel & 255u] && now >= start_ns &&
               now - start_ns >= g.linger_ns) {
      uint32_t exp = S_ACTIVE;
      if (!atomic_compare_exchange_strong_explicit(&k->state, &exp, S_BUSY, memory_order_acq_rel,
                                                   memory_order_relaxed))
        continue; /* its stop came after all */
      if (k->parent) atomic_fetch_sub_explicit(&k->parent->children, 1, memory_order_acq_rel);
      emit_kch(k, MC_REC_KCH_DONE, MC_FLAG_STALE, off, now_real);
      atomic_store_explicit(&k->state, S_FREE, memory_order_release);
    } else if (snapshot && now - start_ns >= g.snapshot_ns / 2) {
      emit_kch(k, MC_REC_KCH, 0, off, now_real);
    }
  }
  for (uint32_t i = 0; i < ctx->npairs; i++) {
    mc_pair_t* pr = &ctx->pairs[i];
    uint32_t st = atomic_load_explicit(&pr->state, memory_order_acquire);
    if (st == S_STOPPED || (abort && st == S_ACTIVE)) {
      uint64_t stop_ns = ticks_to_ns(pr->stop_t);
      if (abort || (now >= stop_ns && now - stop_ns >= g.pair_grace_ns))
        atomic_store_explicit(&pr->state, S_FREE, memory_order_release);
    }
  }
  for (uint32_t i = 0; i < ctx->ncolls; i++) {
    mc_parent_t* p = &ctx->colls[i];
    uint32_t st = atomic_load_explicit(&p->state, memory_order_acquire);
    if (st != S_ACTIVE && st != S_STOPPED) continue;
    int done_kind = p->type == T_COLL ? MC_REC_COLL_DONE : MC_REC_P2P_DONE;
    int snap_kind = p->type == T_COLL ? MC_REC_COLL : MC_REC_P2P;
    if (abort) {
      emit_parent(p, done_kind, MC_FLAG_ABORTED, off, now_real);
      atomic_fetch_add_explicit(&p->children, MC_CH_GEN_ONE, memory_order_acq_rel); /* retired: even */
      atomic_store_explicit(&p->state, S_FREE, memory_order_release);
      continue;
    }
    /* children first (acquire): a child's last activity is stored before its count changes */
    uint64_t children = atomic_load_explicit(&p->children, memory_order_acquire);
    uint64_t last = ticks_to_ns(atomic_load_explicit(&p->last_activity_t, memory_order_relaxed));
    uint32_t seen = ch_seen(children);
    int quiet = now >= last && now - last >= g.linger_ns;
    /* a communicator whose collectives have had children waits for this one's first child
     * (its kernel may be queued behind a long one); one that never had any retires at the
     * linger as before (its transport or NCCL version emits no children) */
    int waiting = p->expect && seen == 0 && ctx->colls_with_children > 0;
    int starved = waiting && now >= last && now - last >= g.child_wait_ns;
    if (st == S_STOPPED && ch_open(children) == 0 && quiet && (!waiting || starved)) {
      /* retire by moving to the next (even) generation, only if no child counted itself since
       * the load: a child that lost this race is an orphan, one that won keeps it open */
      if (!atomic_compare_exchange_strong_explicit(&p->children, &children, children + MC_CH_GEN_ONE,
                                                   memory_order_acq_rel, memory_order_relaxed))
        continue;
      if (seen) ctx->colls_with_children++;
      emit_parent(p, done_kind, starved ? MC_FLAG_UNFINISHED : 0, off, now_real);
      atomic_store_explicit(&p->state, S_FREE, memory_order_release);
    } else if (snapshot && now - ticks_to_ns(p->start_t) >= g.snapshot_ns / 2) {
      emit_parent(p, snap_kind, 0, off, now_real);
    }
  }
}

/* monotonic -> wall clock, fixed once per process: records written in different publish
 * cycles (a flow's, then its collective's) must convert on the same offset, or a child can
 * appear to end after its parent. NTP slews wall time by ppm, so a fixed offset is fine. */
static int64_t mono_to_real_offset(void) {
  static _Atomic int64_t offset;
  static _Atomic int set;
  if (!atomic_load_explicit(&set, memory_order_acquire)) {
    atomic_store_explicit(&offset, (int64_t)real_ns() - (int64_t)mono_ns(), memory_order_relaxed);
    atomic_store_explicit(&set, 1, memory_order_release);
  }
  return atomic_load_explicit(&offset, memory_order_relaxed);
}

static void publish_all(int force_snapshot) {
  uint64_t now = mono_ns();
  clock_maybe_recalibrate(now);
  int64_t off = mono_to_real_offset();
  uint64_t now_real = (uint64_t)((int64_t)now + off);
  int snapshot = force_snapshot || now - g.last_snapshot_ns >= g.snapshot_ns;
  if (snapshot) g.last_snapshot_ns = now;
  for (mc_ctx_t* c = g.live; c; c = c->next) publish_ctx(c, now, off, now_real, snapshot, 0);
  if (g.ring) atomic_store_explicit(&g.ring->published_ns, now_real, memory_order_relaxed);
}

static void* publisher_main(void* arg) {
  uint64_t gen = (uint64_t)(uintptr_t)arg;
  while (atomic_load_explicit(&g.run_gen, memory_order_acquire) == gen) {
    struct timespec ts = {(time_t)(g.tick_ns / 1000000000ull), (long)(g.tick_ns % 1000000000ull)};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&g.lock);
    publish_all(0);
    pthread_mutex_unlock(&g.lock);
  }
  return NULL;
}

/* Create, size and map one ring file in `dir`; -1 when that is not possible. The pages are
 * reserved up front (posix_fallocate): a tmpfs that is full would otherwise fail later, on
 * the first write to a page, with SIGBUS (PR #2326 is NCCL's own fix for /dev/shm). */
static int ring_map_file(const char* dir, void** out) {
  snprintf(g.ring_path, sizeof g.ring_path, "%s/%s%d", dir, MC_RING_FILE_PREFIX, (int)g.pid);
  int fd = open(g.ring_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  int err = ftruncate(fd, (off_t)g.ring_bytes) != 0 ? errno : posix_fallocate(fd, 0, (off_t)g.ring_bytes);
  void* m = err ? MAP_FAILED : mmap(NULL, g.ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    unlink(g.ring_path);
    return -1;
  }
  *out = m;
  return 0;
}

/* The ring: $MYCROFT_NATIVE_RING_DIR (default /dev/shm), else $MYCROFT_NATIVE_RING_FALLBACK_DIR
 * (default /tmp), else anonymous memory: the plugin keeps running (and a chained plugin with
 * it) even where no ring file can be made; only readers lose it. Returns 1 for anonymous. */
static int ring_open(void) {
  const char* dir = getenv("MYCROFT_NATIVE_RING_DIR");
  if (!dir || !*dir) dir = "/dev/shm";
  const char* fallback = getenv("MYCROFT_NATIVE_RING_FALLBACK_DIR");
  if (!fallback || !*fallback) fallback = "/tmp";
  g.cap = pow2_at_least(env_u64("MYCROFT_NATIVE_RING_RECORDS", 16384, 64, 1u << 24), 64, 1u << 24);
  g.ring_bytes = MC_RING_HEADER_SIZE + (size_t)g.cap * MC_RING_RECORD_SIZE;
  void* m = NULL;
  int anonymous = 0;
  if (ring_map_file(dir, &m) != 0 && (!strcmp(dir, fallback) || ring_map_file(fallback, &m) != 0)) {
    m = mmap(NULL, g.ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return -1;
    g.ring_path[0] = 0;
    anonymous = 1;
  }
  mc_ring_header_t* h = (mc_ring_header_t*)m;
  memcpy(h->magic, MC_RING_MAGIC, 8);
  h->version = MC_RING_VERSION;
  h->header_size = MC_RING_HEADER_SIZE;
  h->record_size = MC_RING_RECORD_SIZE;
  h->capacity = g.cap;
  h->pid = (int32_t)g.pid;
  h->snapshot_ms = (uint32_t)(g.snapshot_ns / 1000000ull);
  h->created_ns = real_ns();
  g.records = (mc_record_t*)((char*)m + MC_RING_HEADER_SIZE);
  g.ring = h;
  return anonymous;
}

/* The events Mycroft asks NCCL for, by the profiler version NCCL called it with (one NCCL per
 * process, so one version). KernelCh cost ~1 % on 2.29 (0.26 % in one Megatron run, #1809) but
 * 4.3-13.3 % on 2.31.2 (#2355: it also turns on kernel-phase timestamps and a fence), so v7
 * leaves it off unless MYCROFT_NATIVE_KERNEL_CH=1 (MYCROFT_NATIVE_KERNEL_PHASES=1: phases too).
 * CeColl (v6+) makes copy-engine collectives visible. MYCROFT_NATIVE_EVENT_MASK overrides. */
static int default_mask(int version) {
  int base = MC_EV_COLL | MC_EV_P2P | MC_EV_PROXY_OP | MC_EV_PROXY_STEP;
  int bits = version >= 7 ? (int)MC_EV_BITS_V7 : version == 6 ? (int)MC_EV_BITS_V6
           : version == 5 ? (int)MC_EV_BITS_V5 : (int)MC_EV_BITS_V4;
  const char* forced = getenv("MYCROFT_NATIVE_EVENT_MASK");
  if (forced && *forced) return (int)env_u64("MYCROFT_NATIVE_EVENT_MASK", 0, 0, 0xffff) & bits;
  if (version <= 6) base |= MC_EV_KERNEL_CH;
  if (version >= 6) base |= MC_EV_CE_COLL;
  if (version >= 7 && env_u64("MYCROFT_NATIVE_KERNEL_CH", 0, 0, 1)) base |= MC_EV_KERNEL_CH;
  if (version >= 7 && env_u64("MYCROFT_NATIVE_KERNEL_PHASES", 0, 0, 1)) base |= MC_EV_KERNEL_CH | MC_EV_KERNEL_PHASE;
  return base & bits;
}

static void configure(void) {
  g.pid = getpid();
  clock_init();
  g.snapshot_ns = env_u64("MYCROFT_NATIVE_SNAPSHOT_MS", 100, 1, 3600000) * 1000000ull;
  g.linger_ns = env_u64("MYCROFT_NATIVE_LINGER_MS", 10, 0, 60000) * 1000000ull;
  /* a collective whose kernel channels never come (events masked off, dropped) is retired
   * after this long, flagged unfinished; one still waiting is reported by the snapshots */
  g.child_wait_ns = env_u64("MYCROFT_NATIVE_CHILD_WAIT_MS", 60000, 0, 86400000ull) * 1000000ull;
  /* retire finished events every few ms so the pools stay small */
  g.tick_ns = env_u64("MYCROFT_NATIVE_TICK_MS", 5, 1, 1000) * 1000000ull;
  if (g.tick_ns > g.snapshot_ns) g.tick_ns = g.snapshot_ns;
  g.pool_colls = pow2_at_least(env_u64("MYCROFT_NATIVE_POOL_COLLS", 4096, 4, 1u << 20), 4, 1u << 20);
  g.pool_flows = pow2_at_least(env_u64("MYCROFT_NATIVE_POOL_FLOWS", 8192, 4, 1u << 20), 4, 1u << 20);
  g.pool_kchs = pow2_at_least(env_u64("MYCROFT_NATIVE_POOL_KCHS", 2048, 4, 1u << 20), 4, 1u << 20);
  g.pool_pairs = pow2_at_least(env_u64("MYCROFT_NATIVE_POOL_PAIRS", 16384, 4, 1u << 20), 4, 1u << 20);
  g.pair_grace_ns = env_u64("MYCROFT_NATIVE_CHAIN_GRACE_MS", 2000, 0, 3600000) * 1000000ull;
}

static void ctx_free(mc_ctx_t* c) {
  if (!c) return;
  free(c->colls);
  free(c->flows);
  free(c->kchs);
  free(c->pairs);
  free((void*)c->p2p_seq);
  free(c);
}

/* ------------------------------------------------------------------------------------ */
/* core entry points                                                                      */
/* ------------------------------------------------------------------------------------ */
/* ------------------------------------------------------------------------------------ */
/* chaining: a second profiler plugin beside Mycroft (NCCL loads only one, #1981)          */
/* ------------------------------------------------------------------------------------ */
/* Load MYCROFT_NCCL_PROFILER_CHAIN once (under g.lock): the highest table it exports that is
 * not newer than the version NCCL calls Mycroft with (v7 and v6 descriptors are extensions of
 * the older ones, so a newer descriptor is passed to an older plugin as is, minus the events
 * and states that version does not know). Any failure only leaves the chain off. */
static void chain_load(int version) {
  if (chain.tried) return;
  chain.tried = 1;
  const char* path = getenv("MYCROFT_NCCL_PROFILER_CHAIN");
  if (!path || !*path) return;
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    plog(MC_NCCL_LOG_WARN, "Mycroft profiler: cannot load chained plugin %s; running alone", path);
    return;
  }
  for (int v = version; v >= 4; v--) {
    char sym[32];
    snprintf(sym, sizeof sym, "ncclProfiler_v%d", v);
    void* t = dlsym(lib, sym);
    if (!t) continue;
    const char* name = *(const char* const*)t;
    if (name && !strcmp(name, "Mycroft")) break; /* ourselves: never chain to Mycroft */
    chain.version = v;
    if (v == 4)
      chain.t4 = (const mcNcclProfiler_v4_t*)t;
    else
      chain.t7 = (const mcNcclProfiler_v7_t*)t;
    copy_fixed(chain.name, sizeof chain.name - 1, name ? name : "?");
    chain.lib = lib;
    return;
  }
  plog(MC_NCCL_LOG_WARN, "Mycroft profiler: %s exports no usable ncclProfiler_v4..v7; running alone", path);
  dlclose(lib);
}

static inline uint32_t chain_bits(void) {
  return chain.version >= 7 ? MC_EV_BITS_V7 : chain.version == 6 ? MC_EV_BITS_V6
       : chain.version == 5 ? MC_EV_BITS_V5 : MC_EV_BITS_V4;
}

static inline int ctx_known(const mc_ctx_t* ctx) {
  uint32_t n = atomic_load_explicit(&live_ctx_n, memory_order_acquire);
  for (uint32_t i = 0; i < n; i++)
    if (atomic_load_explicit(&live_ctx[i], memory_order_relaxed) == ctx) return 1;
  return 0;
}

/* ------------------------------------------------------------------------------------ */
/* core entry points                                                                      */
/* ------------------------------------------------------------------------------------ */
static mcNcclResult_t core_init(void** context, int* mask, const char* name, uint64_t hash, int nnodes, int nranks,
                                int rank, mcNcclDebugLogger_t logfn, int version) {
  if (!context) return mcNcclInvalidArgument;
  *context = NULL;
  pthread_mutex_lock(&g.lock);
  if (logfn && !g.log) g.log = logfn;
  if (!g.ring) {
    configure();
    int rc = ring_open();
    if (rc < 0) {
      pthread_mutex_unlock(&g.lock);
      plog(MC_NCCL_LOG_WARN, "Mycroft profiler: cannot map any ring memory%s; plugin disabled", "");
      return mcNcclSystemError;
    }
    if (rc == 1)
      plog(MC_NCCL_LOG_WARN, "Mycroft profiler: no ring file could be created (%s); records stay in memory",
           "ring dir and fallback dir");
  }
  if (g.mask_version != version) {
    atomic_store_explicit(&g.mask, default_mask(version), memory_order_relaxed);
    g.mask_version = version;
  }
  chain_load(version);
  mc_ctx_t* c = calloc(1, sizeof *c);
  if (c) {
    c->comm_hash = hash;
    c->rank = rank;
    c->nranks = nranks;
    c->nnodes = nnodes;
    c->version = version;
    copy_fixed(c->name, sizeof c->name, name);
    c->ncolls = g.pool_colls;
    c->nflows = g.pool_flows;
    c->nkchs = g.pool_kchs;
    c->colls = calloc(c->ncolls, sizeof *c->colls);
    c->flows = calloc(c->nflows, sizeof *c->flows);
    c->kchs = calloc(c->nkchs, sizeof *c->kchs);
    if (chain.lib) {
      c->npairs = g.pool_pairs;
      c->pairs = calloc(c->npairs, sizeof *c->pairs);
    }
    c->overflow.type = T_OVF;
    atomic_store_explicit(&c->overflow.state, S_ACTIVE, memory_order_relaxed);
    if (nranks > 0 && nranks < (1 << 24)) c->p2p_seq = calloc((size_t)nranks * 2, sizeof *c->p2p_seq);
  }
  uint32_t slot = MC_MAX_CTX;
  for (uint32_t i = 0; c && i < MC_MAX_CTX; i++)
    if (!atomic_load_explicit(&live_ctx[i], memory_order_relaxed)) {
      slot = i;
      break;
    }
  if (!c || !c->colls || !c->flows || !c->kchs || (chain.lib && !c->pairs) || slot == MC_MAX_CTX) {
    ctx_free(c);
    pthread_mutex_unlock(&g.lock);
    plog(MC_NCCL_LOG_WARN, "Mycroft profiler: out of memory for %s; plugin disabled", name ? name : "comm");
    return mcNcclSystemError;
  }
  atomic_store_explicit(&live_ctx[slot], c, memory_order_release);
  if (slot + 1 > atomic_load_explicit(&live_ctx_n, memory_order_relaxed))
    atomic_store_explicit(&live_ctx_n, slot + 1, memory_order_release);
  c->next = g.live;
  g.live = c;
  g.nlive++;
  atomic_store_explicit(&g.ring->live_comms, (uint32_t)g.nlive, memory_order_relaxed);
  atomic_store_explicit(&g.ring->finalized, 0, memory_order_relaxed);
  emit_comm(c, MC_REC_COMM, real_ns());
  if (!g.thread_running) {
    uint64_t gen = atomic_fetch_add_explicit(&g.run_gen, 1, memory_order_acq_rel) + 1;
    g.last_snapshot_ns = mono_ns();
    if (pthread_create(&g.thread, NULL, publisher_main, (void*)(uintptr_t)gen) == 0) g.thread_running = 1;
  }
  pthread_mutex_unlock(&g.lock);
  int want = atomic_load_explicit(&g.mask, memory_order_relaxed);
  if (chain.lib) { /* the chained plugin's own context; its failure only leaves it out */
    void* cc = NULL;
    int their = 0;
    mcNcclResult_t rc = chain.version == 4
                            ? chain.t4->init(&cc, &their, name, hash, nnodes, nranks, rank, logfn)
                            : chain.t7->init(&cc, hash, &their, name, nnodes, nranks, rank, logfn);
    if (rc == mcNcclSuccess) {
      c->chain_ctx = cc;
      atomic_store_explicit(&chain.mask, their, memory_order_relaxed); /* one NCCL, one mask: the last init's */
      want |= their & (int)chain_bits();
      /* NCCL will send kernel channels for the chained plugin anyway (NCCL Inspector asks for
       * them): Mycroft keeps them too, at no further cost */
      if (their & MC_EV_KERNEL_CH) atomic_fetch_or_explicit(&g.mask, MC_EV_KERNEL_CH, memory_order_relaxed);
    } else {
      plog(MC_NCCL_LOG_WARN, "Mycroft profiler: chained plugin %s failed to init; Mycroft continues", chain.name);
    }
  }
  if (mask) *mask = want;
  *context = c;
  plog(MC_NCCL_LOG_INFO, "Mycroft profiler: ring %s", g.ring_path);
  return mcNcclSuccess;
}

static mcNcclResult_t core_finalize(void* context) {
  mc_ctx_t* ctx = (mc_ctx_t*)context;
  if (!ctx) return mcNcclSuccess;
  pthread_t join = 0;
  int do_join = 0;
  void* chain_ctx = NULL;
  pthread_mutex_lock(&g.lock);
  mc_ctx_t** pp = &g.live;
  while (*pp && *pp != ctx) pp = &(*pp)->next;
  if (*pp) {
    *pp = ctx->next;
    g.nlive--;
    for (uint32_t i = 0; i < MC_MAX_CTX; i++)
      if (atomic_load_explicit(&live_ctx[i], memory_order_relaxed) == ctx)
        atomic_store_explicit(&live_ctx[i], NULL, memory_order_release);
    chain_ctx = ctx->chain_ctx;
    uint64_t now = mono_ns();
    int64_t off = mono_to_real_offset();
    uint64_t now_real = (uint64_t)((int64_t)now + off);
    /* completed events first, then whatever is still open is closed as aborted */
    publish_ctx(ctx, now, off, now_real, 0, 0);
    publish_ctx(ctx, now, off, now_real, 0, 1);
    emit_comm(ctx, MC_REC_COMM_END, now_real);
    atomic_store_explicit(&g.ring->live_comms, (uint32_t)g.nlive, memory_order_relaxed);
    if (g.nlive == 0) {
      atomic_store_explicit(&g.ring->finalized, 1, memory_order_release);
      if (g.thread_running) {
        atomic_fetch_add_explicit(&g.run_gen, 1, memory_order_acq_rel); /* the running publisher exits */
        join = g.thread;
        do_join = 1;
        g.thread_running = 0;
      }
    }
    ctx_free(ctx); /* NCCL stops its proxy thread before finalizing the profiler */
  }
  pthread_mutex_unlock(&g.lock);
  if (do_join) pthread_join(join, NULL);
  if (chain_ctx) {
    if (chain.version == 4)
      chain.t4->finalize(chain_ctx);
    else
      chain.t7->finalize(chain_ctx);
  }
  return mcNcclSuccess;
}

/* ------------------------------------------------------------------------------------ */
/* per-version adapters                                                                   */
/* ------------------------------------------------------------------------------------ */
static mcNcclResult_t init_v4(void** context, int* mask, const char* name, uint64_t hash, int nnodes, int nranks,
                              int rank, mcNcclDebugLogger_t logfn) {
  return core_init(context, mask, name, hash, nnodes, nranks, rank, logfn, 4);
}

#define MC_INIT_V(N)                                                                                          \
  static mcNcclResult_t init_v##N(void** context, uint64_t commId, int* mask, const char* name, int nnodes,  \
                                  int nranks, int rank, mcNcclDebugLogger_t logfn) {                         \
    return core_init(context, mask, name, commId, nnodes, nranks, rank, logfn, N);                           \
  }
MC_INIT_V(5)
MC_INIT_V(6)
MC_INIT_V(7)

/* One start for every version. `u` points at the descriptor's union: the members Mycroft reads
 * sit at the same offsets in v4..v7 (only `type` widens, v5; v7 appends fields), so each is
 * read through the oldest layout that has it; the static assertions in nccl_profiler_abi.h
 * pin that. Only fv >= 6 reads a CeColl, only fv == 7 the v7 fields. */
/* Events that come from the proxy side, where NCCL can pass another rank's context (PXN,
 * #1586: an address from another process): checked against ours by address, never read. Coll,
 * P2p and CeColl come from the communicator's own thread with its own context. */
static inline int proxy_side(uint64_t type) {
  return type == MC_EV_PROXY_OP || type == MC_EV_PROXY_STEP || type == MC_EV_KERNEL_CH || type == MC_EV_KERNEL_PHASE;
}

MC_INLINE void* core_start(mc_ctx_t* ctx, int fv, uint64_t type, void* parentObj, int rank, const void* u,
                           int chained) {
  /* alone, NCCL only sends what Mycroft's mask enables; chained, also what the other plugin asked for */
  if (chained && !(type & (uint64_t)atomic_load_explicit(&g.mask, memory_order_relaxed))) return NULL;
  /* ProxyStep and KernelPhase never touch the context: their parent is our flow / channel */
  if (MC_LIKELY(type == MC_EV_PROXY_STEP)) return start_step(parentObj, ((const mcProxyStepDescr_t*)u)->step);
  switch (type) {
    case MC_EV_PROXY_OP: {
      if (MC_UNLIKELY(!ctx_known(ctx))) {
        count_foreign_event();
        return NULL;
      }
      const mcProxyOpDescr_t* o = (const mcProxyOpDescr_t*)u;
      return start_flow(ctx, parentObj, rank, o->pid, o->channelId, o->peer, o->nSteps, o->chunkSize, o->isSend);
    }
    case MC_EV_KERNEL_CH: {
      if (MC_UNLIKELY(!ctx_known(ctx))) {
        count_foreign_event();
        return NULL;
      }
      const mcKernelChDescr_t* k = (const mcKernelChDescr_t*)u;
      return start_kch(ctx, parentObj, rank, k->channelId, k->pTimer);
    }
    case MC_EV_COLL: {
      const mcCollDescr_v4_t* c = (const mcCollDescr_v4_t*)u;
      uint16_t flags = 0;
      uint64_t tag = 0;
      const char* variant = NULL;
      if (fv >= 7) {
        const mcCollDescr_v7_t* c7 = (const mcCollDescr_v7_t*)u;
        flags = c7->isSymColl ? MC_FLAG_SYM : 0;
        tag = c7->userTag;
        variant = c7->kernelVariant;
      }
      return start_parent(ctx, T_COLL, c->seqNumber, c->func, c->count, c->datatype, c->root, c->nChannels,
                          c->nWarps, c->algo, c->proto, flags, tag, variant);
    }
    case MC_EV_P2P: {
      const mcP2pDescr_v4_t* p = (const mcP2pDescr_v4_t*)u;
      uint32_t seq = p2p_next_seq(ctx, p->peer, p->func);
      return start_parent(ctx, T_P2P, seq == UINT32_MAX ? UINT64_MAX : seq, p->func, p->count, p->datatype, p->peer,
                          p->nChannels, 0, NULL, NULL, 0, fv >= 7 ? ((const mcP2pDescr_v7_t*)u)->userTag : 0, NULL);
    }
    case MC_EV_CE_COLL: {
      if (fv < 6) return NULL;
      const mcCeCollDescr_v6_t* e = (const mcCeCollDescr_v6_t*)u;
      return start_parent(ctx, T_COLL, e->seqNumber, e->func, e->count, e->datatype, e->root, 0, 0, "CE",
                          e->syncStrategy, MC_FLAG_CE, fv >= 7 ? ((const mcCeCollDescr_v7_t*)u)->userTag : 0, NULL);
    }
    case MC_EV_KERNEL_PHASE: {
      if (fv < 7) return NULL;
      const mcKernelPhaseDescr_t* ph = (const mcKernelPhaseDescr_t*)u;
      return start_phase(parentObj, ph->phaseId, ph->pTimer);
    }
    default: /* event types Mycroft does not keep: no handle */
      return NULL;
  }
}

/* A parent handle as the chained plugin knows it: ours carry its handle at byte 8; one that is
 * not ours (another process's, under PXN) is passed as is, as NCCL would. */
static inline void* chain_parent(mc_ctx_t* ctx, void* p) {
  if (!p || p == (void*)&ctx->overflow) return NULL;
  return owned(ctx, p) ? MC_CHAIN(p) : p;
}

/* Chained start: Mycroft's event first, then the chained plugin's with its own context and
 * parent handles; the handle NCCL gets carries both (ours with theirs inside, or a pair slot
 * when only theirs exists). Their failure never touches ours. */
static void* chain_start(mc_ctx_t* ctx, int fv, const void* d, size_t dsize, uint64_t type, void* parentObj,
                         int rank) {
  const char* u = (const char*)d + 24;
  void* ours = core_start(ctx, fv, type, parentObj, rank, u, 1);
  if (!(type & (uint64_t)atomic_load_explicit(&chain.mask, memory_order_relaxed) & chain_bits())) return ours;
  if (proxy_side(type) && !ctx_known(ctx)) return ours; /* its chain_ctx cannot be read (#1586) */
  if (!ctx->chain_ctx) return ours;
  int own_slot = ours && ours != (void*)&ctx->overflow;
  mc_pair_t* pair = NULL;
  if (!own_slot) {
    MC_POOL_ALLOC(ctx->pairs, ctx->npairs, ctx->pair_cursor, pair);
    if (!pair) { /* the chained plugin never hears of this event (nor of its stop / records) */
      count_chain_dropped();
      return ours;
    }
    pair->type = T_PAIR;
    pair->chain = NULL;
  }
  _Alignas(8) unsigned char buf[sizeof(mcNcclProfilerEventDescr_v7_t)];
  memcpy(buf, d, dsize);
  void* tparent = parentObj;
  int pxn = type == MC_EV_PROXY_OP && ((const mcProxyOpDescr_t*)u)->pid != g.pid;
  if (!pxn) tparent = chain_parent(ctx, parentObj); /* under PXN it is another process's: passed as is */
  if (fv >= 5 && type == MC_EV_COLL) {
    void** pg = (void**)(buf + 24 + offsetof(mcCollDescr_v5_t, parentGroup));
    *pg = chain_parent(ctx, *pg);
    if (chain.version == 4) tparent = *pg; /* v4: a Coll's parent is its Group (NCCL's v4 adapter) */
  } else if (fv >= 5 && type == MC_EV_P2P) {
    void** pg = (void**)(buf + 24 + offsetof(mcP2pDescr_v5_t, parentGroup));
    *pg = chain_parent(ctx, *pg);
    if (chain.version == 4) tparent = *pg;
  }
  memcpy(buf + 8, &tparent, sizeof tparent);
  void* theirs = NULL;
  if (chain.version == 4)
    chain.t4->startEvent(ctx->chain_ctx, &theirs, (mcNcclProfilerEventDescr_v4_t*)buf);
  else
    chain.t7->startEvent(ctx->chain_ctx, &theirs, (mcNcclProfilerEventDescr_v7_t*)buf);
  if (own_slot) {
    MC_CHAIN(ours) = theirs;
    return ours;
  }
  if (!theirs) {
    atomic_store_explicit(&pair->state, S_FREE, memory_order_release);
    return ours;
  }
  pair->chain = theirs;
  atomic_store_explicit(&pair->state, S_ACTIVE, memory_order_release);
  return pair;
}

#define MC_START(NAME, DTYPE, FV, TYPE_EXPR)                                                           \
  static mcNcclResult_t NAME(void* context, void** eHandle, DTYPE* d) {                                \
    if (MC_UNLIKELY(!eHandle)) return mcNcclSuccess;                                                   \
    *eHandle = NULL;                                                                                   \
    mc_ctx_t* ctx = (mc_ctx_t*)context;                                                                \
    if (MC_UNLIKELY(!ctx || !d)) return mcNcclSuccess;                                                 \
    if (MC_LIKELY(!chain.lib))                                                                         \
      *eHandle = core_start(ctx, FV, (uint64_t)(TYPE_EXPR), d->parentObj, d->rank, (const char*)d + 24, 0); \
    else                                                                                               \
      *eHandle = chain_start(ctx, FV, d, sizeof *d, (uint64_t)(TYPE_EXPR), d->parentObj, d->rank);     \
    return mcNcclSuccess;                                                                              \
  }
MC_START(start_v4, mcNcclProfilerEventDescr_v4_t, 4, d->type)
MC_START(start_v5, mcNcclProfilerEventDescr_v5_t, 5, d->type)
MC_START(start_v6, mcNcclProfilerEventDescr_v6_t, 6, d->type)
MC_START(start_v7, mcNcclProfilerEventDescr_v7_t, 7, d->type)

static mcNcclResult_t stop_any(void* eHandle) {
  if (MC_LIKELY(!chain.lib)) return core_stop(eHandle);
  if (!eHandle) return mcNcclSuccess;
  void* theirs = MC_CHAIN(eHandle); /* read first: once stopped, our slot may be reused */
  core_stop(eHandle);
  if (theirs) {
    if (chain.version == 4)
      chain.t4->stopEvent(theirs);
    else
      chain.t7->stopEvent(theirs);
  }
  return mcNcclSuccess;
}

static mcNcclResult_t record_any(void* eHandle, mcNcclProfilerEventState_t s, mcNcclProfilerEventStateArgs_v4_t* a) {
  if (MC_LIKELY(!chain.lib)) return core_record(eHandle, s, a);
  if (!eHandle) return mcNcclSuccess;
  void* theirs = MC_CHAIN(eHandle);
  core_record(eHandle, s, a);
  if (!theirs) return mcNcclSuccess;
  if ((chain.version < 6 && s >= MC_ST_CE_COLL_START && s <= MC_ST_CE_BATCH_COMPLETE) ||
      (chain.version < 7 && s == MC_ST_KERNEL_PHASE_STOP))
    return mcNcclSuccess; /* states that version does not know (NCCL's own adapters drop them) */
  if (chain.version == 4)
    chain.t4->recordEventState(theirs, s, a);
  else
    chain.t7->recordEventState(theirs, s, a);
  return mcNcclSuccess;
}

MC_EXPORT const mcNcclProfiler_v4_t ncclProfiler_v4 = {"Mycroft", init_v4, start_v4, stop_any, record_any,
                                                       core_finalize};
MC_EXPORT const mcNcclProfiler_v5_t ncclProfiler_v5 = {"Mycroft", init_v5, start_v5, stop_any, record_any,
                                                       core_finalize};
MC_EXPORT const mcNcclProfiler_v6_t ncclProfiler_v6 = {"Mycroft", init_v6, start_v6, stop_any, record_any,
                                                       core_finalize};
MC_EXPORT const mcNcclProfiler_v7_t ncclProfiler_v7 = {"Mycroft", init_v7, start_v7, stop_any, record_any,
                                                       core_finalize};

/* ------------------------------------------------------------------------------------ */
/* Mycroft extras (not part of NCCL's ABI): tests and tools                               */
/* ------------------------------------------------------------------------------------ */
/* Publish now (completions + a snapshot of everything in flight); returns records written so far. */
MC_EXPORT uint64_t mycroft_native_flush(void) {
  pthread_mutex_lock(&g.lock);
  uint64_t n = 0;
  if (g.ring) {
    publish_all(1);
    n = atomic_load_explicit(&g.ring->total_records, memory_order_relaxed);
  }
  pthread_mutex_unlock(&g.lock);
  return n;
}

/* The hot-path clock, for tests: a fresh tick converted the publisher's way, the
 * CLOCK_MONOTONIC ns read beside it, and the clock's state (1: counter, 0: monotonic).
 * Returns -1 before the first communicator (the clock is set up then). */
MC_EXPORT int mycroft_native_clock(uint64_t* converted_ns, uint64_t* mono, uint32_t* recalibrations) {
  pthread_mutex_lock(&g.lock);
  int rc = -1;
  if (g.ring) {
    uint64_t t = mc_ticks();
    *mono = mono_ns();
    *converted_ns = ticks_to_ns(t);
    *recalibrations = clk.recalibrations;
    rc = clk.counter;
  }
  pthread_mutex_unlock(&g.lock);
  return rc;
}

#ifdef MC_TEST_HOOKS
/* Test builds: install the interleaving callback (NULL removes it). */
MC_EXPORT void mycroft_native_test_hook(mc_test_hook_t hook) { mc_test_hook = hook; }
#endif

/* Path of this process's ring ("" before the first communicator). */
MC_EXPORT const char* mycroft_native_ring_path(void) { return g.ring_path; }
