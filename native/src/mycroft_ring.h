/*
 * The shared-memory ring the plugin publishes into and the Python reader maps
 * (mycroft/native/ring.py mirrors this layout; both sides check magic, version and
 * sizes). One ring per process, at $MYCROFT_NATIVE_RING_DIR/mycroft-nccl-<pid>
 * (default /dev/shm).
 *
 * Single producer: only the plugin's publisher (the background thread, or finalize /
 * flush, serialised by one mutex that the NCCL hot path never takes) writes records.
 * The reader advances `tail`; when head - tail == capacity the producer drops the
 * record and counts it, it never waits. Each record's `index` (position + 1) is stored
 * last with release order, so a reader can tell a complete record from a stale one.
 */
#ifndef MYCROFT_RING_H
#define MYCROFT_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define MC_RING_MAGIC "MYCRNCCL"
#define MC_RING_VERSION 1u
#define MC_RING_HEADER_SIZE 4096u
#define MC_RING_RECORD_SIZE 128u
#define MC_RING_FILE_PREFIX "mycroft-nccl-"

/* record kinds */
enum {
  MC_REC_COMM = 1,      /* a communicator was initialised (name, nranks) */
  MC_REC_COLL = 2,      /* in-flight collective snapshot */
  MC_REC_COLL_DONE = 3, /* collective completion record */
  MC_REC_P2P = 4,
  MC_REC_P2P_DONE = 5,
  MC_REC_FLOW = 6,      /* in-flight flow (ProxyOp) snapshot with its counters */
  MC_REC_FLOW_DONE = 7, /* flow completion record */
  MC_REC_KCH_DONE = 8,  /* kernel channel completion (GPU timestamps) */
  MC_REC_COMM_END = 9,  /* finalize */
  MC_REC_COLL_INFO = 10, /* v7 facts of the coll / p2p record that follows it (same comm, rank, seq) */
  MC_REC_KCH = 11,       /* in-flight kernel channel snapshot (intra-node progress evidence) */
};

/* record flags */
enum {
  MC_FLAG_ABORTED = 1, /* closed by finalize while still open */
  MC_FLAG_PXN = 2,     /* proxy op issued on behalf of another process */
  MC_FLAG_ORPHAN = 4,  /* no usable parent (dropped, PXN or retired): seq unknown */
  MC_FLAG_ENQUEUED = 8, /* coll/p2p: NCCL's stopEvent (enqueue) was seen */
  MC_FLAG_UNFINISHED = 16, /* coll/p2p: retired without the kernel channels it expected (end unknown) */
  MC_FLAG_SYM = 32,        /* coll: a symmetric-memory kernel collective (v7 isSymColl) */
  MC_FLAG_CE = 64,         /* coll: a copy-engine collective (CeColl event): host enqueue times only */
  MC_FLAG_STALE = 128      /* kernel channel: its stop never came, a later kernel on the channel finished */
};

typedef struct {
  char magic[8];
  uint32_t version;
  uint32_t header_size;
  uint32_t record_size;
  uint32_t capacity; /* records, a power of two */
  int32_t pid;
  uint32_t snapshot_ms;
  uint64_t created_ns; /* CLOCK_REALTIME */
  uint8_t pad0[24];
  _Atomic uint64_t head; /* 64: next position the producer writes */
  uint8_t pad1[56];
  _Atomic uint64_t tail; /* 128: next position the reader consumes (reader-owned) */
  uint8_t pad2[56];
  _Atomic uint64_t dropped_records; /* 192: ring full */
  _Atomic uint64_t dropped_events;  /* 200: pool full, startEvent returned NULL */
  _Atomic uint64_t published_ns;    /* 208: realtime of the last publisher pass */
  _Atomic uint32_t live_comms;      /* 216 */
  _Atomic uint32_t finalized;       /* 220: every communicator finalized */
  _Atomic uint64_t total_records;   /* 224: records written */
  _Atomic uint64_t foreign_events;  /* 232: events under a context that is not ours (dropped) */
  _Atomic uint64_t chain_dropped;   /* 240: events the chained plugin did not get: no pair slot free */
  uint8_t pad3[MC_RING_HEADER_SIZE - 248];
} mc_ring_header_t;

typedef struct {
  uint64_t count;
  uint64_t bytes;
  int32_t root_or_peer; /* coll: root; p2p: peer */
  uint8_t nchannels;
  uint8_t nwarps;
  uint16_t nchildren; /* flows + kernel channels seen */
  char func[14];      /* fixed width, NUL padded, not necessarily terminated */
  char algo[14];
  char dtype[14];
  char proto[6];
} mc_rec_coll_t;

typedef struct {
  int32_t channel;
  int32_t peer;
  int32_t nsteps;
  int32_t chunk;
  uint32_t posted;
  uint32_t gpu_ready;
  uint32_t transmitted;
  uint32_t done;
  uint64_t bytes;       /* sum of transSize */
  uint64_t progress_ns; /* realtime when the counters last changed (publisher-observed) */
  int32_t pid;          /* originating pid (differs under PXN) */
  uint32_t uid;         /* unique per communicator */
  uint8_t is_send;
  uint8_t last_state;  /* last ProxyStep state recorded */
  uint16_t parent_kind; /* MC_REC_COLL_DONE or MC_REC_P2P_DONE, 0 if orphan */
  uint32_t cur_step;    /* step of the last state change */
  uint8_t pad[8];
} mc_rec_flow_t;

typedef struct {
  int32_t channel;
  uint32_t uid;
  uint64_t gpu_start;
  uint64_t gpu_stop;
  uint16_t parent_kind;
  uint8_t phase_mask; /* v7 kernel phases seen: bit i = phase i (0 initial_sync, 1 compute, 2 final_sync) */
  uint8_t pad0;
  uint32_t pad1;
  uint64_t phase_ts[4]; /* phase i runs from phase_ts[i] to phase_ts[i + 1] (GPU globaltimer) */
  uint8_t pad[8];
} mc_rec_kch_t;

typedef struct {
  uint64_t user_tag;     /* ncclCollConfig_t.userProfilerTag, 0 = untagged */
  uint16_t parent_kind;  /* the record this completes: MC_REC_COLL_DONE or MC_REC_P2P_DONE */
  uint8_t is_sym;
  uint8_t pad0;
  uint32_t pad1;
  char kernel_variant[56]; /* NUL padded */
} mc_rec_info_t;

typedef struct {
  int32_t nranks;
  int32_t nnodes;
  uint32_t api_version;
  uint32_t pad;
  char name[56];
} mc_rec_comm_t;

typedef struct {
  _Atomic uint64_t index; /* position + 1, stored last */
  uint16_t kind;
  uint16_t flags;
  int32_t rank;
  uint64_t comm_hash;
  uint64_t seq; /* coll: NCCL seqNumber; p2p: per (peer, direction) count; flows: the parent's */
  uint64_t start_ns;
  uint64_t end_ns; /* 0 while in flight */
  uint64_t time_ns; /* when published */
  union {
    mc_rec_coll_t coll;
    mc_rec_flow_t flow;
    mc_rec_kch_t kch;
    mc_rec_comm_t comm;
    mc_rec_info_t info;
  } u;
} mc_record_t;

_Static_assert(sizeof(mc_ring_header_t) == MC_RING_HEADER_SIZE, "ring header size");
_Static_assert(offsetof(mc_ring_header_t, head) == 64, "head offset");
_Static_assert(offsetof(mc_ring_header_t, tail) == 128, "tail offset");
_Static_assert(offsetof(mc_ring_header_t, dropped_records) == 192, "dropped offset");
_Static_assert(offsetof(mc_ring_header_t, total_records) == 224, "total offset");
_Static_assert(offsetof(mc_ring_header_t, foreign_events) == 232, "foreign offset");
_Static_assert(offsetof(mc_ring_header_t, chain_dropped) == 240, "chain dropped offset");
_Static_assert(sizeof(mc_record_t) == MC_RING_RECORD_SIZE, "record size");
_Static_assert(offsetof(mc_record_t, u) == 56, "payload offset");
_Static_assert(sizeof(mc_rec_coll_t) == 72 && sizeof(mc_rec_flow_t) == 72, "payload size");
_Static_assert(sizeof(mc_rec_kch_t) == 72 && sizeof(mc_rec_comm_t) == 72, "payload size");
_Static_assert(sizeof(mc_rec_info_t) == 72 && offsetof(mc_rec_kch_t, phase_ts) == 32, "payload size");
_Static_assert(offsetof(mc_rec_coll_t, func) == 24 && offsetof(mc_rec_coll_t, proto) == 66, "coll layout");
_Static_assert(offsetof(mc_rec_flow_t, bytes) == 32 && offsetof(mc_rec_flow_t, cur_step) == 60, "flow layout");

#endif /* MYCROFT_RING_H */
