/*
 * Mycroft's own declarations of NCCL's profiler plugin ABI, versions 4 to 7
 * (NCCL 2.27 to 2.31). Written from the documented layout (shared/NCCL_PROFILER_ABI.md),
 * not copied from NCCL: the pip wheels do not ship these headers, and NVIDIA recommends
 * that plugins carry their own copy. Every offset the plugin reads is pinned by a
 * static assertion below, so a layout mistake fails the build instead of reading junk.
 *
 * v4 and v5 declare only what Mycroft reads (plus the v5 API members); v6 and v7 declare
 * every union member with its layout, so the descriptor sizes (112 and 136 bytes) are
 * asserted too: a chained plugin receives the same descriptor NCCL built, and v7 must be a
 * strict extension of v6 (every v6 member at its v6 offset).
 */
#ifndef MYCROFT_NCCL_PROFILER_ABI_H
#define MYCROFT_NCCL_PROFILER_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  mcNcclSuccess = 0,
  mcNcclUnhandledCudaError = 1,
  mcNcclSystemError = 2,
  mcNcclInternalError = 3,
  mcNcclInvalidArgument = 4,
  mcNcclInvalidUsage = 5,
  mcNcclRemoteError = 6,
} mcNcclResult_t;

typedef void (*mcNcclDebugLogger_t)(int level, unsigned long flags, const char* file, int line,
                                    const char* fmt, ...);
enum { MC_NCCL_LOG_WARN = 2, MC_NCCL_LOG_INFO = 3, MC_NCCL_LOG_PROFILE_FLAG = 0x4000 };

/* Event type bits (eActivationMask and descriptor type). */
enum {
  MC_EV_GROUP = 1 << 0,
  MC_EV_COLL = 1 << 1,
  MC_EV_P2P = 1 << 2,
  MC_EV_PROXY_OP = 1 << 3,
  MC_EV_PROXY_STEP = 1 << 4,
  MC_EV_PROXY_CTRL = 1 << 5,
  MC_EV_KERNEL_CH = 1 << 6,
  MC_EV_NET_PLUGIN = 1 << 7,
  MC_EV_GROUP_API = 1 << 8,
  MC_EV_COLL_API = 1 << 9,
  MC_EV_P2P_API = 1 << 10,
  MC_EV_KERNEL_LAUNCH = 1 << 11,
  MC_EV_CE_COLL = 1 << 12, /* v6: copy-engine collective */
  MC_EV_CE_SYNC = 1 << 13,
  MC_EV_CE_BATCH = 1 << 14,
  MC_EV_KERNEL_PHASE = 1 << 15, /* v7: a kernel barrier phase (child of a KernelCh) */
};
/* the event bits each profiler version knows (NCCL never sends a plugin more) */
#define MC_EV_BITS_V4 0xffu
#define MC_EV_BITS_V5 0xfffu
#define MC_EV_BITS_V6 0x7fffu
#define MC_EV_BITS_V7 0xffffu

/* recordEventState states; numbering is stable since v1. */
enum {
  MC_ST_PROXY_OP_SEND_POSTED = 0,
  MC_ST_PROXY_OP_RECV_DONE = 7,
  MC_ST_STEP_SEND_GPU_WAIT = 8,
  MC_ST_STEP_SEND_WAIT = 9,
  MC_ST_STEP_RECV_WAIT = 10,
  MC_ST_STEP_RECV_FLUSH_WAIT = 11,
  MC_ST_STEP_RECV_GPU_WAIT = 12,
  MC_ST_PROXY_CTRL_IDLE = 13,
  MC_ST_PROXY_CTRL_APPEND_END = 18,
  MC_ST_PROXY_OP_IN_PROGRESS_V4 = 19,
  MC_ST_STEP_SEND_PEER_WAIT_V4 = 20,
  MC_ST_NET_PLUGIN_UPDATE = 21,
  MC_ST_KERNEL_CH_STOP = 22,
  MC_ST_GROUP_START_API_STOP = 23,
  MC_ST_GROUP_END_API_START = 24,
  MC_ST_CE_COLL_START = 25, /* v6 CE states 25..30 */
  MC_ST_CE_BATCH_COMPLETE = 30,
  MC_ST_KERNEL_PHASE_STOP = 31, /* v7: args.kernelCh.pTimer = the phase's end */
};
typedef int mcNcclProfilerEventState_t; /* an enum in NCCL: int-sized */

/* ---- event descriptor members shared by v4..v6 ---- */
typedef struct {
  uint64_t seqNumber;
  const char* func;
  const void* sendBuff;
  void* recvBuff;
  size_t count;
  int root;
  const char* datatype;
  uint8_t nChannels;
  uint8_t nWarps;
  const char* algo;
  const char* proto;
} mcCollDescr_v4_t;

typedef struct {
  const char* func;
  void* buff;
  const char* datatype;
  size_t count;
  int peer;
  uint8_t nChannels;
} mcP2pDescr_v4_t;

typedef struct {
  pid_t pid;
  uint8_t channelId;
  int peer;
  int nSteps;
  int chunkSize;
  int isSend;
} mcProxyOpDescr_t;

typedef struct {
  int step;
} mcProxyStepDescr_t;

typedef struct {
  uint8_t channelId;
  uint64_t pTimer;
} mcKernelChDescr_t;

typedef struct {
  int64_t id;
  void* data;
} mcNetPluginDescr_t;

/* v6 copy-engine collective (v7 appends userTag) */
typedef struct {
  uint64_t seqNumber; /* NCCL passes its CE sync count here, not the collective's seqNumber */
  const char* func;
  const void* sendBuff;
  void* recvBuff;
  size_t count;
  int root;
  const char* datatype;
  const char* syncStrategy; /* "MC" (NVLS multicast) or "UC" */
  bool intraBatchSync;
  uint32_t batchSize;
  uint32_t numBatches;
  uint32_t ceSeqNum;
  void* stream;
} mcCeCollDescr_v6_t;

/* ---- v4 (NCCL 2.27) ---- */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    mcCollDescr_v4_t coll;
    mcP2pDescr_v4_t p2p;
    mcProxyOpDescr_t proxyOp;
    mcProxyStepDescr_t proxyStep;
    mcKernelChDescr_t kernelCh;
    mcNetPluginDescr_t netPlugin;
  };
} mcNcclProfilerEventDescr_v4_t;

/* ---- v5 (NCCL 2.28) and v6 (2.29/2.30): 64-bit type, API events, parentGroup ---- */
typedef struct {
  uint64_t seqNumber;
  const char* func;
  const void* sendBuff;
  void* recvBuff;
  size_t count;
  int root;
  const char* datatype;
  uint8_t nChannels;
  uint8_t nWarps;
  const char* algo;
  const char* proto;
  void* parentGroup;
} mcCollDescr_v5_t;

typedef struct {
  const char* func;
  void* buff;
  const char* datatype;
  size_t count;
  int peer;
  uint8_t nChannels;
  void* parentGroup;
} mcP2pDescr_v5_t;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    mcCollDescr_v5_t coll;
    mcP2pDescr_v5_t p2p;
    mcProxyOpDescr_t proxyOp;
    mcProxyStepDescr_t proxyStep;
    mcKernelChDescr_t kernelCh;
    mcNetPluginDescr_t netPlugin;
  };
} mcNcclProfilerEventDescr_v5_t;

/* v6 (2.29/2.30): v5 plus the copy-engine events. Mycroft reads ceColl; CeSync / CeBatch are
 * declared for their layout (the chained plugin may enable them). */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    mcCollDescr_v5_t coll;
    mcP2pDescr_v5_t p2p;
    mcProxyOpDescr_t proxyOp;
    mcProxyStepDescr_t proxyStep;
    mcKernelChDescr_t kernelCh;
    mcNetPluginDescr_t netPlugin;
    mcCeCollDescr_v6_t ceColl;
    struct {
      bool isComplete;
      int nRanks;
    } ceCollSync;
    struct {
      int numOps;
      size_t totalBytes;
      bool useIntraSync;
    } ceCollBatch;
  };
} mcNcclProfilerEventDescr_v6_t;

/* ---- v7 (NCCL 2.31): v6 with fields appended; every v6 member keeps its offset ---- */
typedef struct {
  uint64_t seqNumber;
  const char* func;
  const void* sendBuff;
  void* recvBuff;
  size_t count;
  int root;
  const char* datatype;
  uint8_t nChannels;
  uint8_t nWarps;
  const char* algo;
  const char* proto;
  void* parentGroup;
  const char* kernelVariant; /* v7: the kernel that runs it (symmetric kernels) */
  bool isSymColl;            /* v7: a symmetric-memory kernel collective */
  uint64_t userTag;          /* v7: ncclCollConfig_t.userProfilerTag, 0 = untagged */
} mcCollDescr_v7_t;

typedef struct {
  const char* func;
  void* buff;
  const char* datatype;
  size_t count;
  int peer;
  uint8_t nChannels;
  void* parentGroup;
  uint64_t userTag;
} mcP2pDescr_v7_t;

typedef struct {
  mcCeCollDescr_v6_t v6;
  uint64_t userTag;
} mcCeCollDescr_v7_t;

typedef struct {
  uint8_t channelId;
  uint8_t phaseId; /* 0 initial_sync, 1 compute, 2 final_sync */
  const char* phaseName;
  uint64_t pTimer; /* GPU globaltimer at the phase's start */
} mcKernelPhaseDescr_t;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
      uint64_t userTag;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
      uint64_t userTag;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    mcCollDescr_v7_t coll;
    mcP2pDescr_v7_t p2p;
    mcProxyOpDescr_t proxyOp;
    mcProxyStepDescr_t proxyStep;
    mcKernelChDescr_t kernelCh;
    mcNetPluginDescr_t netPlugin;
    mcCeCollDescr_v7_t ceColl;
    struct {
      bool isComplete;
      int nRanks;
    } ceCollSync;
    struct {
      int numOps;
      size_t totalBytes;
      bool useIntraSync;
    } ceCollBatch;
    mcKernelPhaseDescr_t kernelPhase;
  };
} mcNcclProfilerEventDescr_v7_t;

/* recordEventState arguments, v4+ */
typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
} mcNcclProfilerEventStateArgs_v4_t;
typedef mcNcclProfilerEventStateArgs_v4_t mcNcclProfilerEventStateArgs_v5_t;
typedef mcNcclProfilerEventStateArgs_v4_t mcNcclProfilerEventStateArgs_v6_t;
typedef mcNcclProfilerEventStateArgs_v4_t mcNcclProfilerEventStateArgs_v7_t; /* KernelPhaseStop: kernelCh.pTimer */

/* ---- function tables (same member order in every version) ---- */
typedef struct {
  const char* name;
  mcNcclResult_t (*init)(void** context, int* eActivationMask, const char* commName, uint64_t commHash,
                         int nNodes, int nranks, int rank, mcNcclDebugLogger_t logfn);
  mcNcclResult_t (*startEvent)(void* context, void** eHandle, mcNcclProfilerEventDescr_v4_t* eDescr);
  mcNcclResult_t (*stopEvent)(void* eHandle);
  mcNcclResult_t (*recordEventState)(void* eHandle, mcNcclProfilerEventState_t eState,
                                     mcNcclProfilerEventStateArgs_v4_t* eStateArgs);
  mcNcclResult_t (*finalize)(void* context);
} mcNcclProfiler_v4_t;

typedef struct {
  const char* name;
  mcNcclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                         int nNodes, int nranks, int rank, mcNcclDebugLogger_t logfn);
  mcNcclResult_t (*startEvent)(void* context, void** eHandle, mcNcclProfilerEventDescr_v5_t* eDescr);
  mcNcclResult_t (*stopEvent)(void* eHandle);
  mcNcclResult_t (*recordEventState)(void* eHandle, mcNcclProfilerEventState_t eState,
                                     mcNcclProfilerEventStateArgs_v5_t* eStateArgs);
  mcNcclResult_t (*finalize)(void* context);
} mcNcclProfiler_v5_t;

typedef struct {
  const char* name;
  mcNcclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                         int nNodes, int nranks, int rank, mcNcclDebugLogger_t logfn);
  mcNcclResult_t (*startEvent)(void* context, void** eHandle, mcNcclProfilerEventDescr_v6_t* eDescr);
  mcNcclResult_t (*stopEvent)(void* eHandle);
  mcNcclResult_t (*recordEventState)(void* eHandle, mcNcclProfilerEventState_t eState,
                                     mcNcclProfilerEventStateArgs_v6_t* eStateArgs);
  mcNcclResult_t (*finalize)(void* context);
} mcNcclProfiler_v6_t;

typedef struct {
  const char* name;
  mcNcclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                         int nNodes, int nranks, int rank, mcNcclDebugLogger_t logfn);
  mcNcclResult_t (*startEvent)(void* context, void** eHandle, mcNcclProfilerEventDescr_v7_t* eDescr);
  mcNcclResult_t (*stopEvent)(void* eHandle);
  mcNcclResult_t (*recordEventState)(void* eHandle, mcNcclProfilerEventState_t eState,
                                     mcNcclProfilerEventStateArgs_v7_t* eStateArgs);
  mcNcclResult_t (*finalize)(void* context);
} mcNcclProfiler_v7_t;

/* ---- layout checks (LP64: x86_64 and aarch64 Linux) ---- */
#define MC_ASSERT_OFF(T, m, off) _Static_assert(offsetof(T, m) == (off), #T "." #m " offset")
_Static_assert(sizeof(void*) == 8 && sizeof(size_t) == 8 && sizeof(int) == 4, "LP64 only");
_Static_assert(sizeof(pid_t) == 4, "pid_t is 32-bit");
_Static_assert(sizeof(mcNcclProfilerEventState_t) == 4, "state enum is int-sized");

MC_ASSERT_OFF(mcNcclProfilerEventDescr_v4_t, type, 0);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v4_t, parentObj, 8);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v4_t, rank, 16);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v4_t, coll, 24);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v5_t, type, 0);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v5_t, parentObj, 8);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v5_t, rank, 16);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v5_t, coll, 24);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v5_t, groupApi, 24);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v5_t, proxyOp, 24);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v6_t, type, 0);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v6_t, parentObj, 8);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v6_t, rank, 16);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v6_t, coll, 24);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v6_t, ceColl, 24);
_Static_assert(sizeof(mcNcclProfilerEventDescr_v6_t) == 112, "v6 descriptor size");
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v7_t, type, 0);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v7_t, parentObj, 8);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v7_t, rank, 16);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v7_t, coll, 24);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v7_t, collApi, 24);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v7_t, ceColl, 24);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v7_t, kernelPhase, 24);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v7_t, collApi.graphCaptured, 24 + 40);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v7_t, collApi.userTag, 24 + 48);
MC_ASSERT_OFF(mcNcclProfilerEventDescr_v7_t, p2pApi.userTag, 24 + 40);
_Static_assert(sizeof(mcNcclProfilerEventDescr_v7_t) == 136, "v7 descriptor size");
/* every other v6 / v7 union member, offsets from the descriptor's start (union at 24) */
#define MC_ASSERT_U(T, m, off) MC_ASSERT_OFF(T, m, 24 + (off))
MC_ASSERT_U(mcNcclProfilerEventDescr_v5_t, groupApi.groupDepth, 4);
MC_ASSERT_U(mcNcclProfilerEventDescr_v5_t, collApi.stream, 32);
MC_ASSERT_U(mcNcclProfilerEventDescr_v5_t, collApi.graphCaptured, 40);
MC_ASSERT_U(mcNcclProfilerEventDescr_v5_t, p2pApi.stream, 24);
MC_ASSERT_U(mcNcclProfilerEventDescr_v5_t, p2pApi.graphCaptured, 32);
MC_ASSERT_U(mcNcclProfilerEventDescr_v5_t, kernelLaunch.stream, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, groupApi.graphCaptured, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, groupApi.groupDepth, 4);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, collApi.func, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, collApi.count, 8);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, collApi.datatype, 16);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, collApi.root, 24);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, collApi.stream, 32);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, collApi.graphCaptured, 40);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, p2pApi.func, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, p2pApi.count, 8);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, p2pApi.datatype, 16);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, p2pApi.stream, 24);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, p2pApi.graphCaptured, 32);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, kernelLaunch.stream, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, ceCollSync.isComplete, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, ceCollSync.nRanks, 4);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, ceCollBatch.numOps, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, ceCollBatch.totalBytes, 8);
MC_ASSERT_U(mcNcclProfilerEventDescr_v6_t, ceCollBatch.useIntraSync, 16);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, groupApi.groupDepth, 4);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, collApi.func, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, collApi.count, 8);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, collApi.datatype, 16);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, collApi.root, 24);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, collApi.stream, 32);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, p2pApi.func, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, p2pApi.count, 8);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, p2pApi.datatype, 16);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, p2pApi.stream, 24);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, p2pApi.graphCaptured, 32);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, kernelLaunch.stream, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, proxyOp, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, proxyStep, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, kernelCh, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, netPlugin, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, p2p, 0);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, ceCollSync.nRanks, 4);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, ceCollBatch.totalBytes, 8);
MC_ASSERT_U(mcNcclProfilerEventDescr_v7_t, ceCollBatch.useIntraSync, 16);

MC_ASSERT_OFF(mcCollDescr_v4_t, seqNumber, 0);
MC_ASSERT_OFF(mcCollDescr_v4_t, func, 8);
MC_ASSERT_OFF(mcCollDescr_v4_t, sendBuff, 16);
MC_ASSERT_OFF(mcCollDescr_v4_t, recvBuff, 24);
MC_ASSERT_OFF(mcCollDescr_v4_t, count, 32);
MC_ASSERT_OFF(mcCollDescr_v4_t, root, 40);
MC_ASSERT_OFF(mcCollDescr_v4_t, datatype, 48);
MC_ASSERT_OFF(mcCollDescr_v4_t, nChannels, 56);
MC_ASSERT_OFF(mcCollDescr_v4_t, nWarps, 57);
MC_ASSERT_OFF(mcCollDescr_v4_t, algo, 64);
MC_ASSERT_OFF(mcCollDescr_v4_t, proto, 72);
_Static_assert(sizeof(mcCollDescr_v4_t) == 80, "v4 coll size");
MC_ASSERT_OFF(mcCollDescr_v5_t, seqNumber, 0);
MC_ASSERT_OFF(mcCollDescr_v5_t, func, 8);
MC_ASSERT_OFF(mcCollDescr_v5_t, count, 32);
MC_ASSERT_OFF(mcCollDescr_v5_t, root, 40);
MC_ASSERT_OFF(mcCollDescr_v5_t, datatype, 48);
MC_ASSERT_OFF(mcCollDescr_v5_t, nChannels, 56);
MC_ASSERT_OFF(mcCollDescr_v5_t, algo, 64);
MC_ASSERT_OFF(mcCollDescr_v5_t, proto, 72);
MC_ASSERT_OFF(mcCollDescr_v5_t, parentGroup, 80);

/* v7 coll: every v5/v6 member where it was, the new ones appended */
MC_ASSERT_OFF(mcCollDescr_v7_t, seqNumber, 0);
MC_ASSERT_OFF(mcCollDescr_v7_t, func, 8);
MC_ASSERT_OFF(mcCollDescr_v7_t, sendBuff, 16);
MC_ASSERT_OFF(mcCollDescr_v7_t, recvBuff, 24);
MC_ASSERT_OFF(mcCollDescr_v7_t, count, 32);
MC_ASSERT_OFF(mcCollDescr_v7_t, root, 40);
MC_ASSERT_OFF(mcCollDescr_v7_t, datatype, 48);
MC_ASSERT_OFF(mcCollDescr_v7_t, nChannels, 56);
MC_ASSERT_OFF(mcCollDescr_v7_t, nWarps, 57);
MC_ASSERT_OFF(mcCollDescr_v7_t, algo, 64);
MC_ASSERT_OFF(mcCollDescr_v7_t, proto, 72);
MC_ASSERT_OFF(mcCollDescr_v7_t, parentGroup, 80);
MC_ASSERT_OFF(mcCollDescr_v7_t, kernelVariant, 88);
MC_ASSERT_OFF(mcCollDescr_v7_t, isSymColl, 96);
MC_ASSERT_OFF(mcCollDescr_v7_t, userTag, 104);
_Static_assert(sizeof(mcCollDescr_v7_t) == 112, "v7 coll size");
_Static_assert(sizeof(mcCollDescr_v5_t) == 88, "v5 coll size");

MC_ASSERT_OFF(mcP2pDescr_v4_t, func, 0);
MC_ASSERT_OFF(mcP2pDescr_v4_t, buff, 8);
MC_ASSERT_OFF(mcP2pDescr_v4_t, datatype, 16);
MC_ASSERT_OFF(mcP2pDescr_v4_t, count, 24);
MC_ASSERT_OFF(mcP2pDescr_v4_t, peer, 32);
MC_ASSERT_OFF(mcP2pDescr_v4_t, nChannels, 36);
MC_ASSERT_OFF(mcP2pDescr_v5_t, nChannels, 36);
MC_ASSERT_OFF(mcP2pDescr_v5_t, parentGroup, 40);
MC_ASSERT_OFF(mcP2pDescr_v7_t, func, 0);
MC_ASSERT_OFF(mcP2pDescr_v7_t, buff, 8);
MC_ASSERT_OFF(mcP2pDescr_v7_t, datatype, 16);
MC_ASSERT_OFF(mcP2pDescr_v7_t, count, 24);
MC_ASSERT_OFF(mcP2pDescr_v7_t, peer, 32);
MC_ASSERT_OFF(mcP2pDescr_v7_t, nChannels, 36);
MC_ASSERT_OFF(mcP2pDescr_v7_t, parentGroup, 40);
MC_ASSERT_OFF(mcP2pDescr_v7_t, userTag, 48);

MC_ASSERT_OFF(mcCeCollDescr_v6_t, seqNumber, 0);
MC_ASSERT_OFF(mcCeCollDescr_v6_t, func, 8);
MC_ASSERT_OFF(mcCeCollDescr_v6_t, sendBuff, 16);
MC_ASSERT_OFF(mcCeCollDescr_v6_t, recvBuff, 24);
MC_ASSERT_OFF(mcCeCollDescr_v6_t, count, 32);
MC_ASSERT_OFF(mcCeCollDescr_v6_t, root, 40);
MC_ASSERT_OFF(mcCeCollDescr_v6_t, datatype, 48);
MC_ASSERT_OFF(mcCeCollDescr_v6_t, syncStrategy, 56);
MC_ASSERT_OFF(mcCeCollDescr_v6_t, intraBatchSync, 64);
MC_ASSERT_OFF(mcCeCollDescr_v6_t, batchSize, 68);
MC_ASSERT_OFF(mcCeCollDescr_v6_t, numBatches, 72);
MC_ASSERT_OFF(mcCeCollDescr_v6_t, ceSeqNum, 76);
MC_ASSERT_OFF(mcCeCollDescr_v6_t, stream, 80);
_Static_assert(sizeof(mcCeCollDescr_v6_t) == 88, "v6 ceColl size");
MC_ASSERT_OFF(mcCeCollDescr_v7_t, userTag, 88);
MC_ASSERT_OFF(mcKernelPhaseDescr_t, channelId, 0);
MC_ASSERT_OFF(mcKernelPhaseDescr_t, phaseId, 1);
MC_ASSERT_OFF(mcKernelPhaseDescr_t, phaseName, 8);
MC_ASSERT_OFF(mcKernelPhaseDescr_t, pTimer, 16);

MC_ASSERT_OFF(mcProxyOpDescr_t, pid, 0);
MC_ASSERT_OFF(mcProxyOpDescr_t, channelId, 4);
MC_ASSERT_OFF(mcProxyOpDescr_t, peer, 8);
MC_ASSERT_OFF(mcProxyOpDescr_t, nSteps, 12);
MC_ASSERT_OFF(mcProxyOpDescr_t, chunkSize, 16);
MC_ASSERT_OFF(mcProxyOpDescr_t, isSend, 20);
MC_ASSERT_OFF(mcProxyStepDescr_t, step, 0);
MC_ASSERT_OFF(mcKernelChDescr_t, channelId, 0);
MC_ASSERT_OFF(mcKernelChDescr_t, pTimer, 8);
MC_ASSERT_OFF(mcNetPluginDescr_t, id, 0);
MC_ASSERT_OFF(mcNetPluginDescr_t, data, 8);

_Static_assert(sizeof(mcNcclProfilerEventStateArgs_v4_t) == 8, "state args size");
MC_ASSERT_OFF(mcNcclProfilerEventStateArgs_v4_t, proxyStep.transSize, 0);
MC_ASSERT_OFF(mcNcclProfilerEventStateArgs_v4_t, kernelCh.pTimer, 0);

MC_ASSERT_OFF(mcNcclProfiler_v4_t, name, 0);
MC_ASSERT_OFF(mcNcclProfiler_v4_t, init, 8);
MC_ASSERT_OFF(mcNcclProfiler_v4_t, startEvent, 16);
MC_ASSERT_OFF(mcNcclProfiler_v4_t, stopEvent, 24);
MC_ASSERT_OFF(mcNcclProfiler_v4_t, recordEventState, 32);
MC_ASSERT_OFF(mcNcclProfiler_v4_t, finalize, 40);
_Static_assert(sizeof(mcNcclProfiler_v4_t) == 48, "v4 table size");
MC_ASSERT_OFF(mcNcclProfiler_v5_t, init, 8);
MC_ASSERT_OFF(mcNcclProfiler_v5_t, finalize, 40);
_Static_assert(sizeof(mcNcclProfiler_v5_t) == 48, "v5 table size");
_Static_assert(sizeof(mcNcclProfiler_v6_t) == 48, "v6 table size");
MC_ASSERT_OFF(mcNcclProfiler_v7_t, init, 8);
MC_ASSERT_OFF(mcNcclProfiler_v7_t, startEvent, 16);
MC_ASSERT_OFF(mcNcclProfiler_v7_t, recordEventState, 32);
MC_ASSERT_OFF(mcNcclProfiler_v7_t, finalize, 40);
_Static_assert(sizeof(mcNcclProfiler_v7_t) == 48, "v7 table size");

#ifdef __cplusplus
}
#endif
#endif /* MYCROFT_NCCL_PROFILER_ABI_H */
