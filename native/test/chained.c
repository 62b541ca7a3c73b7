/*
 * A second profiler plugin for the chaining tests (MYCROFT_NCCL_PROFILER_CHAIN): it counts every
 * call it receives and checks that what it is handed is its own (contexts, handles, parents),
 * the way NCCL Inspector or any other plugin would rely on. Exports ncclProfiler_v7 and
 * ncclProfiler_v6; built with -DONLY_V6, -DONLY_V5 or -DONLY_V4 it exports that one table alone
 * (NCCL Inspector of 2.28-2.30 exports v5). When the process exits it writes its counts as JSON to
 * $CHAIN_COUNTER_OUT ("%p" in it: the pid).
 *
 *   CHAIN_COUNTER_MASK=0x...     the event mask its init asks for (default: every event)
 *   CHAIN_COUNTER_FAIL_INIT=1    init fails (Mycroft must carry on alone)
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/nccl_profiler_abi.h"

#define EXPORT __attribute__((visibility("default")))
#define MAGIC_CTX 0xc7c7c7c7u
#define MAGIC_EV 0xe4e4e4e4u
#define MAX_EVENTS (1u << 20)

typedef struct {
  uint32_t magic;
  uint64_t type;
} ev_t;

typedef struct {
  uint32_t magic;
} cctx_t;

static ev_t* evs;
static _Atomic uint32_t nev;
static _Atomic uint64_t starts[16], stops[16], records[32];
static _Atomic uint64_t inits, inits_failed, finalizes, calls_v4, calls_v5, calls_v6, calls_v7;
static _Atomic uint64_t bad_ctx, bad_handle, bad_parent, pxn_parent, null_handles_given;

static int bit_of(uint64_t type) {
  for (int i = 0; i < 16; i++)
    if (type == (1ull << i)) return i;
  return -1;
}

static int is_ours(const void* p) {
  const ev_t* e = (const ev_t*)p;
  return evs && e >= evs && e < evs + MAX_EVENTS && e->magic == MAGIC_EV;
}

static mcNcclResult_t c_init(void** context, uint64_t commId, int* mask, const char* name, int nNodes, int nranks,
                             int rank, mcNcclDebugLogger_t logfn) {
  if (!context || !mask) return mcNcclInvalidArgument;
  (void)commId, (void)name, (void)nNodes, (void)nranks, (void)rank, (void)logfn;
  if (getenv("CHAIN_COUNTER_FAIL_INIT")) {
    atomic_fetch_add(&inits_failed, 1);
    return mcNcclInternalError;
  }
  if (!evs) evs = calloc(MAX_EVENTS, sizeof *evs);
  cctx_t* c = calloc(1, sizeof *c);
  if (!evs || !c) return mcNcclSystemError;
  c->magic = MAGIC_CTX;
  const char* m = getenv("CHAIN_COUNTER_MASK");
  *mask = m ? (int)strtol(m, NULL, 0) : 0xffff;
  *context = c;
  atomic_fetch_add(&inits, 1);
  return mcNcclSuccess;
}

static void start_common(void* context, void** eHandle, uint64_t type, void* parent, const void* u) {
  *eHandle = NULL;
  if (!context || ((cctx_t*)context)->magic != MAGIC_CTX) {
    atomic_fetch_add(&bad_ctx, 1);
    return;
  }
  if (parent && !is_ours(parent)) {
    if (type == MC_EV_PROXY_OP && ((const mcProxyOpDescr_t*)u)->pid != getpid())
      atomic_fetch_add(&pxn_parent, 1); /* another process's handle: legal under PXN, never touched */
    else
      atomic_fetch_add(&bad_parent, 1);
  }
  int b = bit_of(type);
  if (b >= 0) atomic_fetch_add(&starts[b], 1);
  uint32_t i = atomic_fetch_add(&nev, 1);
  if (i >= MAX_EVENTS) {
    atomic_fetch_add(&null_handles_given, 1);
    return;
  }
  evs[i].magic = MAGIC_EV;
  evs[i].type = type;
  *eHandle = &evs[i];
}

#if defined(ONLY_V4)
static mcNcclResult_t c_init_v4(void** context, int* mask, const char* name, uint64_t hash, int nNodes, int nranks,
                                int rank, mcNcclDebugLogger_t logfn) {
  return c_init(context, hash, mask, name, nNodes, nranks, rank, logfn);
}

static mcNcclResult_t c_start_v4(void* context, void** eHandle, mcNcclProfilerEventDescr_v4_t* d) {
  atomic_fetch_add(&calls_v4, 1);
  start_common(context, eHandle, d->type, d->parentObj, &d->coll);
  return mcNcclSuccess;
}
#endif

#if defined(ONLY_V5)
static mcNcclResult_t c_start_v5(void* context, void** eHandle, mcNcclProfilerEventDescr_v5_t* d) {
  atomic_fetch_add(&calls_v5, 1);
  start_common(context, eHandle, d->type, d->parentObj, &d->coll);
  return mcNcclSuccess;
}
#endif

#if !defined(ONLY_V4) && !defined(ONLY_V5)
static mcNcclResult_t c_start_v6(void* context, void** eHandle, mcNcclProfilerEventDescr_v6_t* d) {
  atomic_fetch_add(&calls_v6, 1);
  start_common(context, eHandle, d->type, d->parentObj, &d->coll);
  return mcNcclSuccess;
}
#endif

#if !defined(ONLY_V4) && !defined(ONLY_V5) && !defined(ONLY_V6)
static mcNcclResult_t c_start_v7(void* context, void** eHandle, mcNcclProfilerEventDescr_v7_t* d) {
  atomic_fetch_add(&calls_v7, 1);
  start_common(context, eHandle, d->type, d->parentObj, &d->coll);
  return mcNcclSuccess;
}
#endif

static mcNcclResult_t c_stop(void* h) {
  if (!is_ours(h)) {
    atomic_fetch_add(&bad_handle, 1);
    return mcNcclSuccess;
  }
  int b = bit_of(((ev_t*)h)->type);
  if (b >= 0) atomic_fetch_add(&stops[b], 1);
  return mcNcclSuccess;
}

static mcNcclResult_t c_record(void* h, mcNcclProfilerEventState_t s, mcNcclProfilerEventStateArgs_v7_t* a) {
  (void)a;
  if (!is_ours(h)) {
    atomic_fetch_add(&bad_handle, 1);
    return mcNcclSuccess;
  }
  if (s >= 0 && s < 32) atomic_fetch_add(&records[s], 1);
  return mcNcclSuccess;
}

static void dump(void) {
  const char* out = getenv("CHAIN_COUNTER_OUT");
  if (!out) return;
  char path[4096];
  const char* pp = strstr(out, "%p");
  if (pp)
    snprintf(path, sizeof path, "%.*s%d%s", (int)(pp - out), out, (int)getpid(), pp + 2);
  else
    snprintf(path, sizeof path, "%s", out);
  FILE* f = fopen(path, "w");
  if (!f) return;
  fprintf(f, "{\"pid\": %d, \"inits\": %lu, \"inits_failed\": %lu, \"finalizes\": %lu", (int)getpid(),
          (unsigned long)inits, (unsigned long)inits_failed, (unsigned long)finalizes);
  fprintf(f, ", \"calls_v4\": %lu, \"calls_v5\": %lu, \"calls_v6\": %lu, \"calls_v7\": %lu", (unsigned long)calls_v4,
          (unsigned long)calls_v5, (unsigned long)calls_v6, (unsigned long)calls_v7);
  fprintf(f, ", \"bad_ctx\": %lu, \"bad_handle\": %lu, \"bad_parent\": %lu, \"pxn_parent\": %lu",
          (unsigned long)bad_ctx, (unsigned long)bad_handle, (unsigned long)bad_parent, (unsigned long)pxn_parent);
  const char* names[3] = {"starts", "stops", "records"};
  _Atomic uint64_t* arrays[3] = {starts, stops, records};
  int sizes[3] = {16, 16, 32};
  for (int k = 0; k < 3; k++) {
    fprintf(f, ", \"%s\": {", names[k]);
    int first = 1;
    for (int i = 0; i < sizes[k]; i++) {
      uint64_t v = arrays[k][i];
      if (!v) continue;
      fprintf(f, "%s\"%d\": %lu", first ? "" : ", ", k == 2 ? i : 1 << i, (unsigned long)v);
      first = 0;
    }
    fprintf(f, "}");
  }
  fprintf(f, "}\n");
  fclose(f);
}

static mcNcclResult_t c_finalize(void* context) {
  if (!context || ((cctx_t*)context)->magic != MAGIC_CTX) {
    atomic_fetch_add(&bad_ctx, 1);
    return mcNcclSuccess;
  }
  ((cctx_t*)context)->magic = 0;
  free(context);
  atomic_fetch_add(&finalizes, 1);
  return mcNcclSuccess;
}

__attribute__((destructor)) static void at_exit(void) { /* after every finalize, or none (failed init) */
  dump();
  free(evs);
}

#if defined(ONLY_V4)
EXPORT const mcNcclProfiler_v4_t ncclProfiler_v4 = {"CountingPlugin", c_init_v4, c_start_v4, c_stop, c_record,
                                                    c_finalize};
#elif defined(ONLY_V5)
EXPORT const mcNcclProfiler_v5_t ncclProfiler_v5 = {"CountingPlugin", c_init, c_start_v5, c_stop, c_record,
                                                    c_finalize};
#else
EXPORT const mcNcclProfiler_v6_t ncclProfiler_v6 = {"CountingPlugin", c_init, c_start_v6, c_stop, c_record,
                                                    c_finalize};
#ifndef ONLY_V6
EXPORT const mcNcclProfiler_v7_t ncclProfiler_v7 = {"CountingPlugin", c_init, c_start_v7, c_stop, c_record,
                                                    c_finalize};
#endif
#endif
