/*
 * Test driver for the Mycroft NCCL profiler plugin: dlopens the built library, looks
 * up the exported ncclProfiler_v4 .. _v7 tables and drives them exactly the way
 * NCCL does (NCCL is not needed, nor a GPU).
 *
 *   driver replay LIB VERSION SCRIPT   replay an emulated NCCL call sequence (see below)
 *   driver stress LIB N_COLLS          main thread + proxy threads + ring reader thread
 *   driver bench  LIB                  hot-path cost of start/record/stop triples
 *   driver flood  LIB SECONDS READER   events/s with a reader (READER: internal|external)
 *   driver clock  LIB SECONDS          the hot-path clock against CLOCK_MONOTONIC over time
 *   driver calls  LIB N [op|coll|step] N ProxyOp / Coll / ProxyStep triples, untimed (for callgrind)
 *
 * Replay script: one call per line, handles are small integers.
 *   init C HASH RANK NRANKS NNODES NAME
 *   coll H C SEQ FUNC COUNT DTYPE NCH ALGO PROTO
 *   p2p  H C FUNC PEER COUNT DTYPE NCH
 *   op   H C PARENT CH PEER NSTEPS CHUNK ISSEND [PID|other]   (PARENT: handle, '-' NULL, 'foreign')
 *   step H C PARENT STEP
 *   kch  H C PARENT CH PTIMER
 *   collx H C SEQ FUNC COUNT DTYPE NCH ALGO PROTO TAG SYM VARIANT|-      (v7 Coll)
 *   p2px H C FUNC PEER COUNT DTYPE NCH TAG                              (v7 P2p)
 *   ce   H C SEQ FUNC COUNT DTYPE SYNC TAG                              (v6+ CeColl)
 *   phase H C PARENT ID PTIMER                                          (v7 KernelPhase)
 *   event H C TYPEBITS PARENT          any other event type, empty union (Group, CollApi, CeSync ...)
 *   badctx H                           a KernelCh and a ProxyOp under another rank's context (PXN)
 *   expect_mask C HEX                  the activation mask init returned
 *   rec  H STATE [ARG]
 *   stop H
 *   fin  C
 *   flush | pause | sleep MS | expect_null H | expect_handle H | expect_same H1 H2
 *   hook POINT ... endhook             arm the enclosed lines: they run once, inside the plugin,
 *                                      the next time it reaches POINT (child_validated); needs a
 *                                      test build of the plugin (make hooks)
 *   expect_hooks N                     armed blocks that have run so far
 * Every call must return ncclSuccess; anything else exits non-zero.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../src/mycroft_ring.h"
#include "../src/nccl_profiler_abi.h"

typedef struct {
  int version;
  void* lib;
  const mcNcclProfiler_v4_t* t4;
  const mcNcclProfiler_v7_t* t5; /* v5, v6 and v7 share the table layout (v7 descriptors are a superset) */
  uint64_t (*flush)(void);
  const char* (*ring_path)(void);
} prof_t;

static void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "driver: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(2);
}

static void check(mcNcclResult_t rc, const char* what) {
  if (rc != mcNcclSuccess) die("%s returned %d", what, (int)rc);
}

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  if (level > MC_NCCL_LOG_WARN && !getenv("DRIVER_VERBOSE")) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "plugin log: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

static prof_t load(const char* lib, int version) {
  prof_t p = {.version = version};
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) die("dlopen %s: %s", lib, dlerror());
  p.lib = h;
  char sym[32];
  snprintf(sym, sizeof sym, "ncclProfiler_v%d", version);
  void* t = dlsym(h, sym);
  if (!t) die("%s not exported", sym);
  if (version == 4)
    p.t4 = (const mcNcclProfiler_v4_t*)t;
  else
    p.t5 = (const mcNcclProfiler_v7_t*)t;
  const char* name = version == 4 ? p.t4->name : p.t5->name;
  if (!name || strcmp(name, "Mycroft") != 0) die("%s.name is not Mycroft", sym);
  *(void**)&p.flush = dlsym(h, "mycroft_native_flush");
  *(void**)&p.ring_path = dlsym(h, "mycroft_native_ring_path");
  if (!p.flush || !p.ring_path) die("mycroft extras not exported");
  return p;
}

/* NCCL keeps the mask init wrote and starts only events it enables; so does the driver */
#define MAX_MASKS 256
static struct {
  void* ctx;
  int mask;
} masks[MAX_MASKS];

static int mask_of(void* ctx) {
  for (int i = 0; i < MAX_MASKS; i++)
    if (masks[i].ctx == ctx) return masks[i].mask;
  return -1; /* a context the plugin never gave: NCCL would not have one; pass everything */
}

static void* p_init(prof_t* p, uint64_t hash, int rank, int nranks, int nnodes, const char* name, int* mask) {
  void* ctx = NULL;
  if (p->version == 4)
    check(p->t4->init(&ctx, mask, name, hash, nnodes, nranks, rank, logger), "init");
  else
    check(p->t5->init(&ctx, hash, mask, name, nnodes, nranks, rank, logger), "init");
  if (!ctx) die("init gave no context");
  for (int i = 0; i < MAX_MASKS; i++)
    if (!masks[i].ctx) {
      masks[i].ctx = ctx;
      masks[i].mask = *mask;
      break;
    }
  return ctx;
}

/* Start from a v5 descriptor; for v4 translate it into the v4 layout NCCL 2.27 passes. */
static void* p_start(prof_t* p, void* ctx, mcNcclProfilerEventDescr_v7_t* d) {
  void* h = (void*)0x1; /* must be overwritten */
  if (!(d->type & (uint64_t)(unsigned)mask_of(ctx))) return NULL; /* not enabled: NCCL does not call */
  if (p->version == 4) {
    mcNcclProfilerEventDescr_v4_t d4;
    memset(&d4, 0xa5, sizeof d4); /* poison: the plugin must read only what NCCL sets */
    d4.type = (uint8_t)d->type;
    d4.parentObj = d->parentObj;
    d4.rank = d->rank;
    switch (d->type) {
      case MC_EV_COLL:
        d4.coll.seqNumber = d->coll.seqNumber;
        d4.coll.func = d->coll.func;
        d4.coll.sendBuff = d->coll.sendBuff;
        d4.coll.recvBuff = d->coll.recvBuff;
        d4.coll.count = d->coll.count;
        d4.coll.root = d->coll.root;
        d4.coll.datatype = d->coll.datatype;
        d4.coll.nChannels = d->coll.nChannels;
        d4.coll.nWarps = d->coll.nWarps;
        d4.coll.algo = d->coll.algo;
        d4.coll.proto = d->coll.proto;
        break;
      case MC_EV_P2P:
        d4.p2p.func = d->p2p.func;
        d4.p2p.buff = d->p2p.buff;
        d4.p2p.datatype = d->p2p.datatype;
        d4.p2p.count = d->p2p.count;
        d4.p2p.peer = d->p2p.peer;
        d4.p2p.nChannels = d->p2p.nChannels;
        break;
      case MC_EV_PROXY_OP:
        d4.proxyOp = d->proxyOp;
        break;
      case MC_EV_PROXY_STEP:
        d4.proxyStep = d->proxyStep;
        break;
      case MC_EV_KERNEL_CH:
        d4.kernelCh = d->kernelCh;
        break;
      default:
        break;
    }
    check(p->t4->startEvent(ctx, &h, &d4), "startEvent");
  } else {
    check(p->t5->startEvent(ctx, &h, d), "startEvent");
  }
  if (h == (void*)0x1) die("startEvent left *eHandle unset");
  return h;
}

static inline mcNcclResult_t p_stop(prof_t* p, void* h) {
  return p->version == 4 ? p->t4->stopEvent(h) : p->t5->stopEvent(h);
}

static inline mcNcclResult_t p_rec(prof_t* p, void* h, int st, uint64_t arg) {
  mcNcclProfilerEventStateArgs_v4_t a;
  a.proxyStep.transSize = (size_t)arg;
  return p->version == 4 ? p->t4->recordEventState(h, st, &a) : p->t5->recordEventState(h, st, &a);
}

static void p_fin(prof_t* p, void* ctx) {
  check(p->version == 4 ? p->t4->finalize(ctx) : p->t5->finalize(ctx), "finalize");
  for (int i = 0; i < MAX_MASKS; i++)
    if (masks[i].ctx == ctx) masks[i].ctx = NULL;
}

/* descriptor builders */
static mcNcclProfilerEventDescr_v7_t d_coll(void* parent, int rank, uint64_t seq, const char* func, size_t count,
                                             const char* dtype, int nch, const char* algo, const char* proto) {
  mcNcclProfilerEventDescr_v7_t d;
  memset(&d, 0, sizeof d);
  d.type = MC_EV_COLL;
  d.parentObj = parent;
  d.rank = rank;
  d.coll.seqNumber = seq;
  d.coll.func = func;
  d.coll.count = count;
  d.coll.datatype = dtype;
  d.coll.nChannels = (uint8_t)nch;
  d.coll.nWarps = 16;
  d.coll.algo = algo;
  d.coll.proto = proto;
  return d;
}

static mcNcclProfilerEventDescr_v7_t d_op(void* parent, int rank, pid_t pid, int ch, int peer, int nsteps, int chunk,
                                           int is_send) {
  mcNcclProfilerEventDescr_v7_t d;
  memset(&d, 0, sizeof d);
  d.type = MC_EV_PROXY_OP;
  d.parentObj = parent;
  d.rank = rank;
  d.proxyOp.pid = pid;
  d.proxyOp.channelId = (uint8_t)ch;
  d.proxyOp.peer = peer;
  d.proxyOp.nSteps = nsteps;
  d.proxyOp.chunkSize = chunk;
  d.proxyOp.isSend = is_send;
  return d;
}

static mcNcclProfilerEventDescr_v7_t d_step(void* parent, int rank, int step) {
  mcNcclProfilerEventDescr_v7_t d;
  memset(&d, 0, sizeof d);
  d.type = MC_EV_PROXY_STEP;
  d.parentObj = parent;
  d.rank = rank;
  d.proxyStep.step = step;
  return d;
}

static mcNcclProfilerEventDescr_v7_t d_kch(void* parent, int rank, int ch, uint64_t ptimer) {
  mcNcclProfilerEventDescr_v7_t d;
  memset(&d, 0, sizeof d);
  d.type = MC_EV_KERNEL_CH;
  d.parentObj = parent;
  d.rank = rank;
  d.kernelCh.channelId = (uint8_t)ch;
  d.kernelCh.pTimer = ptimer;
  return d;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------------------ */
/* replay                                                                                 */
/* ------------------------------------------------------------------------------------ */
#define MAX_HANDLES 65536
#define MAX_CTX 64
static void* handles[MAX_HANDLES];
static void* ctxs[MAX_CTX];
static int ctx_rank[MAX_CTX];
static const char* const FOREIGN = (const char*)0x10; /* a parentObj from another address space */

static int hid(const char* s) {
  int v = atoi(s);
  if (v < 0 || v >= MAX_HANDLES) die("bad handle %s", s);
  return v;
}

static int cid(const char* s) {
  int v = atoi(s);
  if (v < 0 || v >= MAX_CTX) die("bad context %s", s);
  return v;
}

static void* parent_of(const char* s) {
  if (!strcmp(s, "-")) return NULL;
  if (!strcmp(s, "foreign")) return (void*)FOREIGN;
  return handles[hid(s)];
}

/* strings must outlive the call: NCCL passes static strings; keep ours in an arena */
static char* kept[4 * MAX_HANDLES];
static size_t nkept;
static const char* keep(const char* s) {
  char* c = strdup(s);
  if (!c || nkept == sizeof kept / sizeof kept[0]) die("oom");
  kept[nkept++] = c;
  return c;
}

/* the replay's state: the loaded plugin, the script's lines and an armed interleaving hook */
static prof_t P;
static char** lines;
static int nlines;
static struct {
  int point, first, last; /* armed: lines [first, last) run once when the plugin reaches point */
  int runs;
} hook = {0, -1, -1, 0};

static void run_lines(int from, int to);

/* Test builds of the plugin (make hooks) call back at points where another thread could
 * interleave; the armed block of script lines runs there, on the calling thread, once. */
static void on_hook(int point, void* obj) {
  (void)obj;
  if (point != hook.point || hook.first < 0) return;
  int first = hook.first, last = hook.last;
  hook.first = hook.last = -1;
  hook.runs++;
  run_lines(first, last);
}

static int hook_point_of(const char* name) {
  if (!strcmp(name, "child_validated")) return 1; /* MC_HOOK_CHILD_VALIDATED */
  die("unknown hook point %s", name);
  return 0;
}

/* Run script lines [from, to): one call per line. */
static void run_lines(int from, int to) {
  prof_t p = P;
  for (int i = from; i < to; i++) {
    int lineno = i + 1;
    char line[1024];
    snprintf(line, sizeof line, "%s", lines[i]);
    char* tok[16];
    char* save = NULL;
    int n = 0;
    for (char* s = strtok_r(line, " \t\r\n", &save); s && n < 16; s = strtok_r(NULL, " \t\r\n", &save)) tok[n++] = s;
    if (n == 0 || tok[0][0] == '#') continue;
    const char* op = tok[0];
#define NEED(k) \
  if (n < (k)) die("line %d: %s needs %d fields", lineno, op, (k))
    if (!strcmp(op, "hook")) { /* hook POINT ... endhook: arm the block for the plugin's next call at POINT */
      NEED(2);
      int j = i + 1;
      while (j < to && strncmp(lines[j], "endhook", 7)) j++;
      if (j == to) die("line %d: hook without endhook", lineno);
      void (*set)(void (*)(int, void*));
      *(void**)&set = dlsym(p.lib, "mycroft_native_test_hook");
      if (!set) die("line %d: hook needs a test build of the plugin (make hooks)", lineno);
      set(on_hook);
      hook.point = hook_point_of(tok[1]);
      hook.first = i + 1;
      hook.last = j;
      i = j;
      continue;
    } else if (!strcmp(op, "expect_hooks")) { /* expect_hooks N: armed blocks that ran so far */
      NEED(2);
      if (hook.runs != atoi(tok[1])) die("line %d: %d hook blocks ran, expected %s", lineno, hook.runs, tok[1]);
      continue;
    } else if (!strcmp(op, "expect_same")) { /* expect_same H1 H2: the plugin gave both the same handle (a reused slot) */
      NEED(3);
      if (handles[hid(tok[1])] != handles[hid(tok[2])]) die("line %d: handles %s and %s differ", lineno, tok[1], tok[2]);
      continue;
    }
    if (!strcmp(op, "init")) {
      NEED(7);
      int c = cid(tok[1]);
      int mask = 0;
      ctx_rank[c] = atoi(tok[3]);
      ctxs[c] = p_init(&p, strtoull(tok[2], NULL, 16), ctx_rank[c], atoi(tok[4]), atoi(tok[5]), tok[6], &mask);
      int want = MC_EV_COLL | MC_EV_P2P | MC_EV_PROXY_OP | MC_EV_PROXY_STEP;
      if ((mask & want) != want && !getenv("MYCROFT_NATIVE_EVENT_MASK"))
        die("activation mask 0x%x lacks 0x%x", mask, want);
    } else if (!strcmp(op, "expect_mask")) { /* expect_mask C HEX: the mask init gave NCCL */
      NEED(3);
      int got = mask_of(ctxs[cid(tok[1])]);
      if (got != (int)strtol(tok[2], NULL, 16)) die("line %d: mask 0x%x, expected %s", lineno, got, tok[2]);
    } else if (!strcmp(op, "collx")) { /* v7: collx H C SEQ FUNC COUNT DTYPE NCH ALGO PROTO TAG SYM VARIANT|- */
      NEED(13);
      int c = cid(tok[2]);
      mcNcclProfilerEventDescr_v7_t d = d_coll(NULL, ctx_rank[c], strtoull(tok[3], NULL, 10), keep(tok[4]),
                                               strtoull(tok[5], NULL, 10), keep(tok[6]), atoi(tok[7]), keep(tok[8]),
                                               keep(tok[9]));
      d.coll.userTag = strtoull(tok[10], NULL, 0);
      d.coll.isSymColl = atoi(tok[11]) != 0;
      d.coll.kernelVariant = strcmp(tok[12], "-") ? keep(tok[12]) : NULL;
      handles[hid(tok[1])] = p_start(&p, ctxs[c], &d);
    } else if (!strcmp(op, "ce")) { /* ce H C SEQ FUNC COUNT DTYPE SYNC TAG: a copy-engine collective */
      NEED(9);
      int c = cid(tok[2]);
      mcNcclProfilerEventDescr_v7_t d;
      memset(&d, 0, sizeof d);
      d.type = MC_EV_CE_COLL;
      d.rank = ctx_rank[c];
      d.ceColl.v6.seqNumber = strtoull(tok[3], NULL, 10);
      d.ceColl.v6.func = keep(tok[4]);
      d.ceColl.v6.count = strtoull(tok[5], NULL, 10);
      d.ceColl.v6.datatype = keep(tok[6]);
      d.ceColl.v6.syncStrategy = keep(tok[7]);
      d.ceColl.v6.ceSeqNum = (uint32_t)d.ceColl.v6.seqNumber;
      d.ceColl.userTag = strtoull(tok[8], NULL, 0);
      handles[hid(tok[1])] = p_start(&p, ctxs[c], &d);
    } else if (!strcmp(op, "phase")) { /* phase H C PARENT ID PTIMER: a v7 kernel phase */
      NEED(6);
      static const char* const names[] = {"initial_sync", "compute", "final_sync"};
      int c = cid(tok[2]);
      mcNcclProfilerEventDescr_v7_t d;
      memset(&d, 0, sizeof d);
      d.type = MC_EV_KERNEL_PHASE;
      d.parentObj = parent_of(tok[3]);
      d.rank = ctx_rank[c];
      d.kernelPhase.channelId = 0;
      d.kernelPhase.phaseId = (uint8_t)atoi(tok[4]);
      d.kernelPhase.phaseName = names[d.kernelPhase.phaseId % 3];
      d.kernelPhase.pTimer = strtoull(tok[5], NULL, 10);
      handles[hid(tok[1])] = p_start(&p, ctxs[c], &d);
    } else if (!strcmp(op, "event")) { /* event H C TYPEBITS PARENT: any other event (API, Group, CeSync) */
      NEED(5);
      int c = cid(tok[2]);
      mcNcclProfilerEventDescr_v7_t d;
      memset(&d, 0, sizeof d);
      d.type = strtoull(tok[3], NULL, 0);
      d.parentObj = parent_of(tok[4]);
      d.rank = ctx_rank[c];
      handles[hid(tok[1])] = p_start(&p, ctxs[c], &d);
    } else if (!strcmp(op, "badctx")) { /* badctx H: a KernelCh and a ProxyOp under another rank's context (#1586) */
      NEED(2);
      static unsigned char alien[4096]; /* readable here; in NCCL it is another process's address */
      memset(alien, 0x5a, sizeof alien);
      mcNcclProfilerEventDescr_v7_t d = d_kch(NULL, 0, 0, 1);
      handles[hid(tok[1])] = p_start(&p, alien, &d);
      mcNcclProfilerEventDescr_v7_t dop = d_op(NULL, 0, getpid(), 0, 1, 1, 8, 1);
      void* h2 = p_start(&p, alien, &dop);
      if (h2) die("line %d: a foreign context got a flow handle", lineno);
    } else if (!strcmp(op, "coll")) {
      NEED(10);
      int c = cid(tok[2]);
      mcNcclProfilerEventDescr_v7_t d = d_coll(NULL, ctx_rank[c], strtoull(tok[3], NULL, 10), keep(tok[4]),
                                               strtoull(tok[5], NULL, 10), keep(tok[6]), atoi(tok[7]), keep(tok[8]),
                                               keep(tok[9]));
      handles[hid(tok[1])] = p_start(&p, ctxs[c], &d);
    } else if (!strcmp(op, "p2p") || !strcmp(op, "p2px")) {
      NEED(op[3] == 'x' ? 9 : 8);
      int c = cid(tok[2]);
      mcNcclProfilerEventDescr_v7_t d;
      memset(&d, 0, sizeof d);
      d.type = MC_EV_P2P;
      d.rank = ctx_rank[c];
      d.p2p.func = keep(tok[3]);
      d.p2p.peer = atoi(tok[4]);
      d.p2p.count = strtoull(tok[5], NULL, 10);
      d.p2p.datatype = keep(tok[6]);
      d.p2p.nChannels = (uint8_t)atoi(tok[7]);
      if (op[3] == 'x') d.p2p.userTag = strtoull(tok[8], NULL, 0);
      handles[hid(tok[1])] = p_start(&p, ctxs[c], &d);
    } else if (!strcmp(op, "op")) {
      NEED(9);
      int c = cid(tok[2]);
      pid_t pid = getpid();
      if (n > 9) pid = strcmp(tok[9], "other") ? (pid_t)atoi(tok[9]) : getpid() + 100000;
      mcNcclProfilerEventDescr_v7_t d = d_op(parent_of(tok[3]), ctx_rank[c], pid, atoi(tok[4]), atoi(tok[5]),
                                             atoi(tok[6]), atoi(tok[7]), atoi(tok[8]));
      handles[hid(tok[1])] = p_start(&p, ctxs[c], &d);
    } else if (!strcmp(op, "step")) {
      NEED(5);
      int c = cid(tok[2]);
      mcNcclProfilerEventDescr_v7_t d = d_step(parent_of(tok[3]), ctx_rank[c], atoi(tok[4]));
      handles[hid(tok[1])] = p_start(&p, ctxs[c], &d);
    } else if (!strcmp(op, "kch")) {
      NEED(6);
      int c = cid(tok[2]);
      mcNcclProfilerEventDescr_v7_t d = d_kch(parent_of(tok[3]), ctx_rank[c], atoi(tok[4]), strtoull(tok[5], NULL, 10));
      handles[hid(tok[1])] = p_start(&p, ctxs[c], &d);
    } else if (!strcmp(op, "rec")) {
      NEED(3);
      check(p_rec(&p, handles[hid(tok[1])], atoi(tok[2]), n > 3 ? strtoull(tok[3], NULL, 10) : 0), "recordEventState");
    } else if (!strcmp(op, "stop")) {
      NEED(2);
      check(p_stop(&p, handles[hid(tok[1])]), "stopEvent");
    } else if (!strcmp(op, "fin")) {
      NEED(2);
      int c = cid(tok[1]);
      p_fin(&p, ctxs[c]);
      ctxs[c] = NULL;
    } else if (!strcmp(op, "flush")) {
      p.flush();
    } else if (!strcmp(op, "pause")) {
      p.flush();
      printf("READY %s\n", p.ring_path());
      fflush(stdout);
      char buf[64];
      if (!fgets(buf, sizeof buf, stdin)) { /* parent gone: behave like a crashed rank */
        _exit(3);
      }
    } else if (!strcmp(op, "sleep")) {
      NEED(2);
      struct timespec ts = {0, atol(tok[1]) * 1000000L};
      nanosleep(&ts, NULL);
    } else if (!strcmp(op, "expect_null")) {
      NEED(2);
      if (handles[hid(tok[1])]) die("line %d: expected a NULL handle", lineno);
    } else if (!strcmp(op, "expect_handle")) {
      NEED(2);
      if (!handles[hid(tok[1])]) die("line %d: expected a handle", lineno);
    } else if (!strcmp(op, "crash")) {
      p.flush();
      _exit(0); /* leave the ring behind, no finalize */
    } else {
      die("line %d: unknown op %s", lineno, op);
    }
  }
#undef NEED
}

static int cmd_replay(const char* lib, int version, const char* script) {
  P = load(lib, version);
  prof_t p = P;
  FILE* f = strcmp(script, "-") ? fopen(script, "r") : stdin;
  if (!f) die("cannot open %s", script);
  char buf[1024];
  int cap = 0;
  while (fgets(buf, sizeof buf, f)) {
    if (nlines == cap) {
      cap = cap ? 2 * cap : 256;
      lines = realloc(lines, (size_t)cap * sizeof *lines);
      if (!lines) die("oom");
    }
    if (!(lines[nlines++] = strdup(buf))) die("oom");
  }
  if (f != stdin) fclose(f);
  run_lines(0, nlines);
  for (int i = 0; i < nlines; i++) free(lines[i]);
  free(lines);
  printf("DONE %s\n", p.ring_path());
  for (size_t i = 0; i < nkept; i++) free(kept[i]);
  return 0;
}

/* ------------------------------------------------------------------------------------ */
/* ring reader (C): the stress test's reader thread and the flood benchmark's             */
/* ------------------------------------------------------------------------------------ */
typedef struct {
  const char* path;
  atomic_int stop;
  uint64_t read, bad, by_kind[16];
} reader_t;

static void* reader_main(void* arg) {
  reader_t* r = (reader_t*)arg;
  int fd = open(r->path, O_RDWR);
  if (fd < 0) die("reader: open %s", r->path);
  struct stat st;
  fstat(fd, &st);
  void* m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) die("reader: mmap");
  mc_ring_header_t* h = (mc_ring_header_t*)m;
  if (memcmp(h->magic, MC_RING_MAGIC, 8) || h->record_size != MC_RING_RECORD_SIZE) die("reader: bad ring header");
  mc_record_t* recs = (mc_record_t*)((char*)m + h->header_size);
  uint64_t cap = h->capacity;
  for (;;) {
    int stopping = atomic_load(&r->stop);
    uint64_t head = atomic_load_explicit(&h->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
    for (; tail < head; tail++) {
      mc_record_t* rec = &recs[tail & (cap - 1)];
      if (atomic_load_explicit(&rec->index, memory_order_acquire) != tail + 1) {
        r->bad++;
        continue;
      }
      r->read++;
      if (rec->kind < 16) r->by_kind[rec->kind]++;
    }
    atomic_store_explicit(&h->tail, tail, memory_order_release);
    if (stopping) break;
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  munmap(m, (size_t)st.st_size);
  return NULL;
}

/* ------------------------------------------------------------------------------------ */
/* stress: main thread issues collectives, one proxy thread per comm runs their flows,    */
/* the publisher thread writes the ring, a reader thread drains it                        */
/* ------------------------------------------------------------------------------------ */
#define QCAP 1024
typedef struct {
  prof_t* p;
  void* ctx;
  int rank, nranks, ncolls, nch, nsteps;
  void* q[QCAP];
  _Atomic uint64_t qhead, qtail;
  atomic_int done;
  uint64_t flows_started, kch_started, null_handles;
} comm_t;

static void ring_allreduce_children(prof_t* p, comm_t* c, void* coll, int iter) {
  void* kch[64];
  void* ops[128];
  int nops = 0;
  for (int ch = 0; ch < c->nch; ch++) {
    mcNcclProfilerEventDescr_v7_t dk = d_kch(coll, c->rank, ch, (uint64_t)iter * 1000u);
    kch[ch] = p_start(p, c->ctx, &dk);
    c->kch_started++;
    for (int s = 0; s < 2; s++) {
      int peer = s ? (c->rank + 1) % c->nranks : (c->rank + c->nranks - 1) % c->nranks;
      /* every 16th collective has a PXN flow: the parentObj must not be touched */
      int pxn = (iter % 16 == 0 && ch == 0 && s == 0);
      mcNcclProfilerEventDescr_v7_t d =
          d_op(pxn ? (void*)FOREIGN : coll, c->rank, pxn ? getpid() + 1 : getpid(), ch, peer, c->nsteps, 1 << 17, s);
      void* op = p_start(p, c->ctx, &d);
      if (!op) c->null_handles++;
      ops[nops++] = op;
      c->flows_started++;
    }
  }
  for (int step = 0; step < c->nsteps; step++) {
    for (int i = 0; i < nops; i++) {
      mcNcclProfilerEventDescr_v7_t d = d_step(ops[i], c->rank, step);
      void* sh = p_start(p, c->ctx, &d);
      if (i & 1) {
        check(p_rec(p, sh, MC_ST_STEP_SEND_GPU_WAIT, 0), "rec");
        check(p_rec(p, sh, MC_ST_STEP_SEND_PEER_WAIT_V4, 0), "rec");
        check(p_rec(p, sh, MC_ST_STEP_SEND_WAIT, 1 << 17), "rec");
      } else {
        check(p_rec(p, sh, MC_ST_STEP_RECV_WAIT, 0), "rec");
        check(p_rec(p, sh, MC_ST_STEP_RECV_FLUSH_WAIT, 1 << 17), "rec");
        check(p_rec(p, sh, MC_ST_STEP_RECV_GPU_WAIT, 0), "rec");
      }
      check(p_stop(p, sh), "stop");
    }
  }
  for (int i = 0; i < nops; i++) check(p_stop(p, ops[i]), "stop");
  for (int ch = 0; ch < c->nch; ch++) {
    check(p_rec(p, kch[ch], MC_ST_KERNEL_CH_STOP, (uint64_t)iter * 1000u + 500u), "rec");
    check(p_stop(p, kch[ch]), "stop");
  }
}

static void* proxy_main(void* arg) {
  comm_t* c = (comm_t*)arg;
  int iter = 0;
  for (;;) {
    uint64_t tail = atomic_load_explicit(&c->qtail, memory_order_relaxed);
    if (tail == atomic_load_explicit(&c->qhead, memory_order_acquire)) {
      if (atomic_load(&c->done)) break;
      sched_yield();
      continue;
    }
    void* coll = c->q[tail % QCAP];
    atomic_store_explicit(&c->qtail, tail + 1, memory_order_release);
    ring_allreduce_children(c->p, c, coll, iter++);
  }
  return NULL;
}

static int cmd_stress(const char* lib, int ncolls) {
  /* pools big enough that nothing is dropped, so the accounting below can be exact */
  setenv("MYCROFT_NATIVE_POOL_COLLS", "65536", 0);
  setenv("MYCROFT_NATIVE_POOL_FLOWS", "65536", 0);
  setenv("MYCROFT_NATIVE_POOL_KCHS", "65536", 0);
  setenv("MYCROFT_NATIVE_TICK_MS", "1", 0);
  setenv("MYCROFT_NATIVE_RING_RECORDS", "262144", 0);
  prof_t p = load(lib, 6);
  enum { NCOMM = 3 };
  comm_t comms[NCOMM];
  memset(comms, 0, sizeof comms);
  pthread_t th[NCOMM];
  for (int i = 0; i < NCOMM; i++) {
    comms[i].p = &p;
    comms[i].rank = i;
    comms[i].nranks = 4;
    comms[i].ncolls = ncolls;
    comms[i].nch = 4;
    comms[i].nsteps = 8;
    int mask;
    char name[32];
    snprintf(name, sizeof name, "stress%d", i);
    comms[i].ctx = p_init(&p, 0xabc000 + (uint64_t)i, i, 4, 1, name, &mask);
  }
  reader_t rd = {.path = p.ring_path()};
  pthread_t rth;
  pthread_create(&rth, NULL, reader_main, &rd);
  for (int i = 0; i < NCOMM; i++) pthread_create(&th[i], NULL, proxy_main, &comms[i]);
  uint64_t colls = 0;
  for (int k = 0; k < ncolls; k++) {
    for (int i = 0; i < NCOMM; i++) {
      comm_t* c = &comms[i];
      mcNcclProfilerEventDescr_v7_t d = d_coll(NULL, c->rank, (uint64_t)k, "AllReduce", 1u << 20, "ncclFloat32",
                                               c->nch, "RING", "SIMPLE");
      void* h = p_start(&p, c->ctx, &d);
      while (atomic_load_explicit(&c->qhead, memory_order_relaxed) - atomic_load_explicit(&c->qtail, memory_order_acquire) >=
             QCAP)
        sched_yield();
      uint64_t head = atomic_load_explicit(&c->qhead, memory_order_relaxed);
      c->q[head % QCAP] = h;
      atomic_store_explicit(&c->qhead, head + 1, memory_order_release);
      check(p_stop(&p, h), "stop"); /* enqueued: children may still be starting */
      colls++;
    }
    if (k % 64 == 0) p.flush(); /* flush from another thread races with the publisher */
  }
  for (int i = 0; i < NCOMM; i++) {
    atomic_store(&comms[i].done, 1);
    pthread_join(th[i], NULL);
  }
  /* leave one collective open on comm 0 and finalize it anyway */
  mcNcclProfilerEventDescr_v7_t d = d_coll(NULL, 0, (uint64_t)ncolls, "AllReduce", 1024, "ncclFloat32", 1, "RING",
                                           "LL");
  void* open_coll = p_start(&p, comms[0].ctx, &d);
  mcNcclProfilerEventDescr_v7_t dop = d_op(open_coll, 0, getpid(), 0, 1, 4, 4096, 1);
  void* open_op = p_start(&p, comms[0].ctx, &dop);
  mcNcclProfilerEventDescr_v7_t ds = d_step(open_op, 0, 0);
  void* open_step = p_start(&p, comms[0].ctx, &ds);
  check(p_rec(&p, open_step, MC_ST_STEP_SEND_GPU_WAIT, 0), "rec");
  struct timespec ts = {0, 50 * 1000000L};
  nanosleep(&ts, NULL); /* let the linger period pass so every finished collective is retired */
  for (int i = 0; i < NCOMM; i++) p_fin(&p, comms[i].ctx);
  atomic_store(&rd.stop, 1);
  pthread_join(rth, NULL);

  uint64_t flows = 0, kchs = 0;
  for (int i = 0; i < NCOMM; i++) {
    flows += comms[i].flows_started;
    kchs += comms[i].kch_started;
  }
  int fd = open(p.ring_path(), O_RDONLY);
  mc_ring_header_t h;
  if (fd < 0 || read(fd, &h, sizeof h) != (ssize_t)sizeof h) die("cannot reread ring header");
  close(fd);
  uint64_t total = atomic_load(&h.total_records), dropped = atomic_load(&h.dropped_records);
  uint64_t dropped_ev = atomic_load(&h.dropped_events);
  printf("{\"colls\": %" PRIu64 ", \"flows\": %" PRIu64 ", \"kchs\": %" PRIu64 ", \"records\": %" PRIu64
         ", \"read\": %" PRIu64 ", \"bad\": %" PRIu64 ", \"dropped_records\": %" PRIu64 ", \"dropped_events\": %" PRIu64
         ", \"coll_done\": %" PRIu64 ", \"flow_done\": %" PRIu64 ", \"kch_done\": %" PRIu64 "}\n",
         colls, flows, kchs, total, rd.read, rd.bad, dropped, dropped_ev, rd.by_kind[MC_REC_COLL_DONE],
         rd.by_kind[MC_REC_FLOW_DONE], rd.by_kind[MC_REC_KCH_DONE]);
  int ok = rd.bad == 0 && rd.read == total;
  if (dropped == 0 && dropped_ev == 0) {
    /* nothing dropped: every event must have exactly one completion record */
    ok = ok && rd.by_kind[MC_REC_COLL_DONE] == colls + 1 && rd.by_kind[MC_REC_FLOW_DONE] == flows + 1 &&
         rd.by_kind[MC_REC_KCH_DONE] == kchs;
  } else {
    ok = ok && rd.by_kind[MC_REC_FLOW_DONE] + dropped + dropped_ev >= flows;
  }
  if (!ok) die("stress: record accounting does not add up");
  unlink(p.ring_path());
  return 0;
}

/* ------------------------------------------------------------------------------------ */
/* bench                                                                                  */
/* ------------------------------------------------------------------------------------ */
static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static int cmd_bench(const char* lib) {
  setenv("MYCROFT_NATIVE_LINGER_MS", "0", 0); /* flush() between batches retires everything */
  prof_t p = load(lib, 6);
  int mask;
  void* ctx = p_init(&p, 0xbe4c4, 0, 2, 1, "bench", &mask);
  enum { BATCH = 1000, NB = 400 };
  double per[NB];
  const mcNcclProfiler_v7_t* t = p.t5;

  /* ProxyStep: the event NCCL issues most (one per step per flow) */
  mcNcclProfilerEventDescr_v7_t dc = d_coll(NULL, 0, 0, "AllReduce", 1 << 20, "ncclFloat32", 1, "RING", "SIMPLE");
  void* coll = p_start(&p, ctx, &dc);
  mcNcclProfilerEventDescr_v7_t dop = d_op(coll, 0, getpid(), 0, 1, 1 << 30, 1 << 17, 1);
  void* op = p_start(&p, ctx, &dop);
  mcNcclProfilerEventDescr_v7_t ds = d_step(op, 0, 0);
  mcNcclProfilerEventStateArgs_v7_t a = {.proxyStep = {1 << 17}};
  int step = 0;
  for (int b = 0; b < NB; b++) {
    uint64_t t0 = now_ns();
    for (int i = 0; i < BATCH; i++) {
      void* h;
      ds.proxyStep.step = step++;
      t->startEvent(ctx, &h, &ds);
      t->recordEventState(h, MC_ST_STEP_SEND_WAIT, &a);
      t->stopEvent(h);
    }
    per[b] = (double)(now_ns() - t0) / BATCH;
  }
  double step_med = median(per, NB);

  /* ProxyOp (a flow): pool allocation + two clock reads */
  for (int b = 0; b < NB; b++) {
    uint64_t t0 = now_ns();
    for (int i = 0; i < BATCH / 10; i++) {
      void* h;
      t->startEvent(ctx, &h, &dop);
      t->recordEventState(h, MC_ST_PROXY_OP_IN_PROGRESS_V4, NULL);
      t->stopEvent(h);
    }
    per[b] = (double)(now_ns() - t0) / (BATCH / 10);
    p.flush(); /* retire them so the pool never fills */
  }
  double op_med = median(per, NB);

  /* Coll: pool allocation, string copies, two clock reads */
  for (int b = 0; b < NB; b++) {
    uint64_t t0 = now_ns();
    for (int i = 0; i < BATCH / 10; i++) {
      void* h;
      dc.coll.seqNumber++;
      t->startEvent(ctx, &h, &dc);
      t->recordEventState(h, MC_ST_PROXY_OP_IN_PROGRESS_V4, NULL);
      t->stopEvent(h);
    }
    per[b] = (double)(now_ns() - t0) / (BATCH / 10);
    p.flush();
  }
  double coll_med = median(per, NB);
  t->stopEvent(op);
  t->stopEvent(coll);
  p_fin(&p, ctx);
  unlink(p.ring_path());
  printf("{\"proxy_step_triple_ns\": %.1f, \"proxy_op_triple_ns\": %.1f, \"coll_triple_ns\": %.1f}\n", step_med,
         op_med, coll_med);
  return 0;
}

/* flood: ring all-reduces (8 channels x send+recv, 8 steps, + 8 kernel channels) as fast as
 * one thread can issue them, for SECONDS; READER internal = a C reader thread drains, external
 * = somebody else (the Python reader) does. */
static int cmd_flood(const char* lib, double seconds, int internal) {
  prof_t p = load(lib, 6);
  int mask;
  comm_t c;
  memset(&c, 0, sizeof c);
  c.p = &p;
  c.rank = 0;
  c.nranks = 8;
  c.nch = 8;
  c.nsteps = 8;
  c.ctx = p_init(&p, 0xf100d, 0, 8, 2, "flood", &mask);
  reader_t rd = {.path = p.ring_path()};
  pthread_t rth;
  if (internal) {
    pthread_create(&rth, NULL, reader_main, &rd);
  } else {
    printf("READY %s\n", p.ring_path());
    fflush(stdout);
    char buf[16];
    if (!fgets(buf, sizeof buf, stdin)) return 3;
  }
  uint64_t t0 = now_ns(), end = t0 + (uint64_t)(seconds * 1e9), colls = 0;
  while (now_ns() < end) {
    for (int k = 0; k < 64; k++) {
      mcNcclProfilerEventDescr_v7_t d =
          d_coll(NULL, 0, colls, "AllReduce", 1 << 22, "ncclFloat32", c.nch, "RING", "SIMPLE");
      void* h = p_start(&p, c.ctx, &d);
      ring_allreduce_children(&p, &c, h, (int)colls + 1);
      check(p_stop(&p, h), "stop");
      colls++;
    }
  }
  double elapsed = (double)(now_ns() - t0) / 1e9;
  struct timespec ts = {0, 100 * 1000000L};
  nanosleep(&ts, NULL);
  p.flush();
  /* events per collective: coll (start+stop) + per channel kch (start+rec+stop)
   * + 2 flows x (start+stop) + 2 flows x steps x (start + 3 rec + stop) */
  uint64_t ev_per = 2 + (uint64_t)c.nch * (3 + 2 * 2 + 2 * (uint64_t)c.nsteps * 5);
  int fd = open(p.ring_path(), O_RDONLY);
  mc_ring_header_t h;
  if (fd < 0 || read(fd, &h, sizeof h) != (ssize_t)sizeof h) die("cannot reread ring header");
  close(fd);
  if (internal) {
    atomic_store(&rd.stop, 1);
    pthread_join(rth, NULL);
  } else {
    printf("FINISHED\n");
    fflush(stdout);
    char buf[16];
    if (!fgets(buf, sizeof buf, stdin)) return 3;
  }
  p_fin(&p, c.ctx);
  printf("{\"seconds\": %.3f, \"collectives\": %" PRIu64 ", \"events\": %" PRIu64 ", \"events_per_s\": %.0f"
         ", \"records\": %" PRIu64 ", \"dropped_records\": %" PRIu64 ", \"dropped_events\": %" PRIu64
         ", \"bytes_per_collective\": %.1f}\n",
         elapsed, colls, colls * ev_per, (double)(colls * ev_per) / elapsed, atomic_load(&h.total_records),
         atomic_load(&h.dropped_records), atomic_load(&h.dropped_events),
         colls ? (double)(atomic_load(&h.total_records) * MC_RING_RECORD_SIZE) / (double)colls : 0.0);
  if (internal) unlink(p.ring_path());
  return 0;
}

/* clock: convert fresh ticks the publisher's way every 10 ms for SECONDS; report the
 * largest difference from CLOCK_MONOTONIC read beside them, and whether conversions ever
 * went backwards (they must not: the map is continuous). */
static int cmd_clock(const char* lib, double seconds) {
  prof_t p = load(lib, 6);
  int mask;
  void* ctx = p_init(&p, 0xc10c, 0, 1, 1, "clock", &mask);
  int (*clock_fn)(uint64_t*, uint64_t*, uint32_t*) = NULL;
  *(void**)&clock_fn = dlsym(RTLD_DEFAULT, "mycroft_native_clock");
  if (!clock_fn) {
    void* h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    if (h) *(void**)&clock_fn = dlsym(h, "mycroft_native_clock");
  }
  if (!clock_fn) die("mycroft_native_clock not exported");
  uint64_t start = now_ns(), prev = 0, conv = 0, mono = 0;
  uint32_t recal = 0;
  int64_t max_err = 0, last_err = 0;
  int backwards = 0, mode = -1, samples = 0;
  while (now_ns() - start < (uint64_t)(seconds * 1e9)) {
    mode = clock_fn(&conv, &mono, &recal);
    if (conv < prev) backwards++;
    prev = conv;
    int64_t err = (int64_t)conv - (int64_t)mono;
    last_err = err;
    if (now_ns() - start > 300000000ull && (err > max_err || -err > max_err)) max_err = err < 0 ? -err : err;
    samples++;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  p_fin(&p, ctx);
  unlink(p.ring_path());
  printf("{\"counter\": %d, \"samples\": %d, \"recalibrations\": %u, \"max_abs_err_ns_after_300ms\": %" PRId64
         ", \"last_err_ns\": %" PRId64 ", \"backwards\": %d}\n",
         mode, samples, recal, max_err, last_err, backwards);
  return backwards ? 1 : 0;
}

/* calls: N ProxyOp and N Coll start/record/stop triples with no timing around them, so
 * callgrind's count over the table functions is the per-event cost in instructions. */
static int cmd_calls(const char* lib, int n, const char* kind) {
  int do_step = !strcmp(kind, "step");
  int do_op = !do_step && strcmp(kind, "coll") != 0, do_coll = !do_step && strcmp(kind, "op") != 0;
  setenv("MYCROFT_NATIVE_LINGER_MS", "0", 0);
  prof_t p = load(lib, 6);
  int mask;
  void* ctx = p_init(&p, 0xca11, 0, 2, 1, "calls", &mask);
  const mcNcclProfiler_v7_t* t = p.t5;
  mcNcclProfilerEventDescr_v7_t dc = d_coll(NULL, 0, 0, "AllReduce", 1 << 20, "ncclFloat32", 1, "RING", "SIMPLE");
  void* coll = p_start(&p, ctx, &dc);
  mcNcclProfilerEventDescr_v7_t dop = d_op(coll, 0, getpid(), 0, 1, 1 << 30, 1 << 17, 1);
  if (do_step) {
    void* op = p_start(&p, ctx, &dop);
    mcNcclProfilerEventDescr_v7_t ds = d_step(op, 0, 0);
    mcNcclProfilerEventStateArgs_v7_t a = {.proxyStep = {1 << 17}};
    for (int i = 0; i < n; i++) {
      void* h;
      ds.proxyStep.step = i;
      t->startEvent(ctx, &h, &ds);
      t->recordEventState(h, MC_ST_STEP_SEND_WAIT, &a);
      t->stopEvent(h);
    }
    t->stopEvent(op);
  }
  for (int i = 0; do_op && i < n; i++) {
    void* h;
    t->startEvent(ctx, &h, &dop);
    t->recordEventState(h, MC_ST_PROXY_OP_IN_PROGRESS_V4, NULL);
    t->stopEvent(h);
    if (i % 100 == 99) p.flush();
  }
  t->stopEvent(coll);
  for (int i = 0; do_coll && i < n; i++) {
    void* h;
    dc.coll.seqNumber++;
    t->startEvent(ctx, &h, &dc);
    t->recordEventState(h, MC_ST_PROXY_OP_IN_PROGRESS_V4, NULL);
    t->stopEvent(h);
    if (i % 100 == 99) p.flush();
  }
  p_fin(&p, ctx);
  unlink(p.ring_path());
  printf("{\"triples\": %d}\n", n);
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 5 && !strcmp(argv[1], "replay")) {
    const char* v = argv[3];
    int version = atoi(v[0] == 'v' ? v + 1 : v);
    if (version < 4 || version > 7) die("version must be v4, v5, v6 or v7");
    return cmd_replay(argv[2], version, argv[4]);
  }
  if (argc >= 4 && !strcmp(argv[1], "stress")) return cmd_stress(argv[2], atoi(argv[3]));
  if (argc >= 3 && !strcmp(argv[1], "bench")) return cmd_bench(argv[2]);
  if (argc >= 5 && !strcmp(argv[1], "flood")) return cmd_flood(argv[2], atof(argv[3]), !strcmp(argv[4], "internal"));
  if (argc >= 4 && !strcmp(argv[1], "clock")) return cmd_clock(argv[2], atof(argv[3]));
  if (argc >= 4 && !strcmp(argv[1], "calls")) return cmd_calls(argv[2], atoi(argv[3]), argc >= 5 ? argv[4] : "both");
  fprintf(stderr,
          "usage: driver replay LIB v4|v5|v6|v7 SCRIPT | stress LIB N | bench LIB | flood LIB SECONDS internal|external"
          " | clock LIB SECONDS | calls LIB N [op|coll|step]\n");
  return 2;
}
