/* The training thread's hot path in C: one synchronous collective on a host-synchronous group.
 *
 * Every collective a rank issues from Python passes through patching._collective_wrapper. Its
 * bookkeeping (find the group, read the payload and torch's seq counter, build the OpRecord, put
 * it in flight, complete and queue it at return) costs ~6 us of CPython bytecode per call on a
 * 2-core VM, next to a ~25 us gloo all_reduce of 4 KiB: more than users accept always on. This
 * does the same for the common call -- a collective (not p2p) on a group whose ops are done when
 * the call returns (gloo, any host-synchronous backend), outside any other wrapped call -- with
 * the same Python objects (Recorder, GroupInfo), so everything after the recorder (the runtime, spans,
 * heartbeats) cannot tell the two apart. A plain sync op goes into the recorder's Ring, not an OpRecord: the
 * runtime thread makes its OpRecord (Recorder.take_done, snapshot_inflight).
 *
 * Whatever it does not take -- nested calls, an unknown or device-async group, any error before
 * it touched state -- goes to the Python wrapper (the definition) with the same arguments, so a
 * call is handled whole by one of the two. tests/instrumentation/test_compiled_hot_path.py runs the same
 * calls both ways and compares the records and the recorder's counters.
 *
 * Hot(slow, original, recorder, api, op, group, payload, reduce_op, async_op, root, issues_many[, compiler]): one
 *   wrapped function's state (the ArgRefs as ops.OpSpec has them; root: a callable or None; compiler:
 *   torch.compiler, whose _is_compiling_flag sends a call straight to original as is_compiling() would)
 * door(original, name, module[, doc]) -> the builtin function torch.distributed gets; its __self__ (a Door)
 *   hands each call to door.__self__.hot, a Hot, or to original while that is None (see Door below).
 * configure(op_record_type, group_info_type, depth_type, payload_info, state_completed, state_in_flight) once,
 * before the first Hot is made.
 * Wait(original, waiters): torch's Work.wait with Recorder.waiters kept (see below).
 * Ring(capacity): Recorder.ring, the sync ops in fixed slots (see Ring below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* ------------------------------------------------------------------ configuration */

/* OpRecord's slots written here, in this order (op_record.OpRecord.__init__ writes the same) */
enum {
    R_API, R_ASYNC, R_BYTES, R_DEVICE, R_DTYPE, R_END, R_GROUP, R_OP, R_REDUCE, R_SEQ, R_START, R_STATE,
    N_RECORD_SLOTS
};
static const char *const RECORD_SLOTS[N_RECORD_SLOTS] = {
    "api", "async_op", "bytes", "device", "dtype", "end_ns", "group", "op", "reduce_op", "seq", "start_ns", "state",
};
static Py_ssize_t record_offsets[N_RECORD_SLOTS];
static PyTypeObject *record_type;

/* GroupInfo's slots read or written per call (groups.GroupInfo, a slotted dataclass) */
enum { G_DEREF, G_DEVICE_ASYNC, G_HAS_COUNTER, G_SEQ_OF, G_P2P_DELTA, G_ISSUED, G_COMPLETED, N_GROUP_SLOTS };
static const char *const GROUP_SLOTS[N_GROUP_SLOTS] = {
    "deref", "device_async", "has_counter", "seq_of", "p2p_counter_delta", "issued", "completed",
};
static Py_ssize_t group_offsets[N_GROUP_SLOTS];
static PyTypeObject *group_type;
/* recorder.Depth: a thread's nesting depth, its `value` slot read and written in place */
static PyTypeObject *depth_type;
static Py_ssize_t depth_value_offset;
static PyObject *payload_info; /* recorder.payload_info: (bytes, dtype) of anything that is not a tensor */
static PyObject *state_completed, *state_in_flight;

/* attribute names (code, not schema keys) */
enum {
    A_DEPTH, A_DEFAULT, A_BY_PG, A_NBYTES, A_DTYPE, A_COUNTERS,
    A_PUSH, A_QUEUE, A_QUEUE_SIZE, A_INFLIGHT, A_PER_THREAD, A_GROUPS, A_FAILED, A_ISSUED_CALL, A_COMPLETE_THROUGH,
    A_APPEND, A_COMPILING_FLAG, A_RING,
    N_ATTRS
};
static const char *const ATTR_NAMES[N_ATTRS] = {
    "depth", "_default", "_by_pg", "nbytes", "dtype", "counters", "_push", "queue", "queue_size", "inflight",
    "per_thread", "groups", "failed", "issued", "complete_through_call", "append", "_is_compiling_flag", "ring",
};
static PyObject *names[N_ATTRS];
static PyObject *zero;
static int configured;

/* the offsets of `count` object slots of `type`, or -1 with an error */
static int
slot_offsets(PyObject *type, const char *const *slots, int count, Py_ssize_t *offsets)
{
    for (int i = 0; i < count; i++) {
        PyObject *descr = PyDict_GetItemString(((PyTypeObject *)type)->tp_dict, slots[i]);
        if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type) {
            PyErr_Format(PyExc_TypeError, "configure: %s is no slot of %R", slots[i], type);
            return -1;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "configure: slot %s of %R is not an object slot", slots[i], type);
            return -1;
        }
        offsets[i] = member->offset;
    }
    return 0;
}

/* All or nothing: everything is read and checked into locals first, then committed with no call in between
 * (a failing second call leaves the first one's types and offsets as they were). */
static PyObject *
configure(PyObject *module, PyObject *args)
{
    PyObject *type, *groups, *depth, *info, *completed, *in_flight;
    static const char *const DEPTH_SLOTS[1] = {"value"};
    Py_ssize_t new_record[N_RECORD_SLOTS], new_group[N_GROUP_SLOTS], new_depth;
    (void)module;
    if (!PyArg_ParseTuple(args, "O!O!O!OUU:configure", &PyType_Type, &type, &PyType_Type, &groups, &PyType_Type,
                          &depth, &info, &completed, &in_flight))
        return NULL;
    if (slot_offsets(type, RECORD_SLOTS, N_RECORD_SLOTS, new_record) < 0 ||
        slot_offsets(groups, GROUP_SLOTS, N_GROUP_SLOTS, new_group) < 0 ||
        slot_offsets(depth, DEPTH_SLOTS, 1, &new_depth) < 0)
        return NULL;
    for (int i = 0; i < N_ATTRS; i++) { /* names are the same whatever the types: made once, kept */
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(ATTR_NAMES[i])) == NULL)
            return NULL;
    }
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    /* commit: no error possible from here on */
    memcpy(record_offsets, new_record, sizeof(record_offsets));
    memcpy(group_offsets, new_group, sizeof(group_offsets));
    depth_value_offset = new_depth;
    Py_INCREF(depth);
    Py_XSETREF(depth_type, (PyTypeObject *)depth);
    Py_INCREF(groups);
    Py_XSETREF(group_type, (PyTypeObject *)groups);
    Py_INCREF(type);
    Py_XSETREF(record_type, (PyTypeObject *)type);
    Py_INCREF(info);
    Py_XSETREF(payload_info, info);
    Py_INCREF(completed);
    Py_XSETREF(state_completed, completed);
    Py_INCREF(in_flight);
    Py_XSETREF(state_in_flight, in_flight);
    configured = 1;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ never harm: whose errors, which process
 *
 * Only Exceptions are Mycroft's to handle. Wherever this file would swallow an error raised by Python code it
 * ran (a payload's getter entering a tensor subclass's __torch_function__, payload_info, the rooted ops' helper,
 * a custom __bool__, the recorder's helpers), a BaseException that is not an Exception -- KeyboardInterrupt,
 * SystemExit, GeneratorExit: a Ctrl-C landing in our code -- is left set and goes out of the call as it would
 * without Mycroft: raised before torch's call, that call is not made. */

/* 0 with the pending error cleared (or none set) when it is an Exception; -1, the error left set, when not */
static int
clear_ours(void)
{
    PyObject *type = PyErr_Occurred();
    if (type != NULL && !PyErr_GivenExceptionMatches(type, PyExc_Exception))
        return -1;
    PyErr_Clear();
    return 0;
}

/* fork: a child starts clean. pthread_atfork's child handler (any fork: os.fork, multiprocessing, a C library)
 * only moves this generation on, which is all that is safe to do there. A Ring made or last reset in another
 * generation forgets its slots at its next use in the child (ring_current: the parent's ops are the parent's,
 * their references are neither released nor completed here), and an op begun before the fork is not completed
 * in the child (hot_call compares the generation its begin saw). Recorder's os.register_at_fork hook clears the
 * child's copies of the Python side (records in flight, the queue). Read and written under the GIL. */
static unsigned long fork_generation;

static void
after_fork_in_child(void)
{
    fork_generation++;
}

/* ------------------------------------------------------------------ Counters */

/* Recorder.counters: the recorder's per-op counters as C integers, bumped by both paths on every op.
 * As the recorder's attributes they were nine lookups in its instance dict and two new ints a call. */
typedef struct {
    PyObject_HEAD
    long long last_activity_ns, comm_ns, comm_since_ns, ops_done;
} Counters;

static PyMemberDef counters_members[] = {
    {"last_activity_ns", T_LONGLONG, offsetof(Counters, last_activity_ns), 0, "when an op last began or ended (ns)"},
    {"comm_ns", T_LONGLONG, offsetof(Counters, comm_ns), 0, "time with at least one op in flight, cumulative (ns)"},
    {"comm_since_ns", T_LONGLONG, offsetof(Counters, comm_since_ns), 0, "when the in-flight set last filled (ns)"},
    {"ops_done", T_LONGLONG, offsetof(Counters, ops_done), 0, "ops completed"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CountersType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mycroft.instrumentation._hotpath.Counters",
    .tp_basicsize = sizeof(Counters),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_members = counters_members,
    .tp_doc = "A recorder's per-op counters (all 0 when made).",
};

static PyTypeObject RingType; /* below */

/* ------------------------------------------------------------------ the Hot object */

static inline PyObject *
new_ref(PyObject *value)
{
    Py_INCREF(value);
    return value;
}

typedef struct {
    int present;         /* 0: the op has no such argument (ops.NO_ARG); the reduce op and the async flag
                          * are read only by keyword-named refs, as Recorder.beginner reads them */
    Py_ssize_t position; /* PY_SSIZE_T_MAX: keyword only */
    PyObject *keyword;   /* str, or NULL: positional only */
} ArgRef;

typedef struct {
    PyObject_HEAD
    PyObject *slow;      /* the Python wrapper: takes every call this does not */
    PyObject *root;      /* rooted ops: root(record, info, args, kwargs) sets record.root (Python); else NULL */
    PyObject *original;  /* torch's function */
    PyObject *recorder;
    PyObject *api, *op;  /* str */
    ArgRef group, payload, reduce_op, async_op;
    int issues_many;
    /* fixed for the recorder's lifetime, read once */
    PyObject *per_thread, *groups, *groups_dict, *queue, *inflight, *queue_append, *recorder_dict;
    Counters *counters;
    struct Ring *ring; /* recorder.ring, or NULL: every op as an OpRecord (see Ring below) */
    PyObject *compiler_dict; /* torch.compiler's globals (its _is_compiling_flag), or NULL */
    long long handled, delegated; /* calls taken here / handed to the Python wrapper */
} Hot;

static long long
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* what time.time_ns() reads */
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* One call's arguments as vectorcall passes them: positional ones, then the keyword ones' values
 * in the order of kwnames (a tuple of str, or NULL). */
typedef struct {
    PyObject *const *args;
    Py_ssize_t nargs;
    PyObject *kwnames;
} Call;

/* args[position] or the value of keyword; a borrowed reference, NULL when absent (no error set) */
static PyObject *
argument(const Call *call, const ArgRef *ref)
{
    if (ref->position < call->nargs)
        return call->args[ref->position];
    if (ref->keyword == NULL || call->kwnames == NULL)
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(call->kwnames);
    for (Py_ssize_t i = 0; i < count; i++) { /* names from code are interned: identity first */
        if (PyTuple_GET_ITEM(call->kwnames, i) == ref->keyword)
            return call->args[call->nargs + i];
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (PyUnicode_Compare(PyTuple_GET_ITEM(call->kwnames, i), ref->keyword) == 0)
            return call->args[call->nargs + i];
    }
    PyErr_Clear(); /* str against str runs no code: no error in fact */
    return NULL;
}

/* The call as (args, kwargs): a new tuple and a new dict or None (Python helpers take them so) */
static int
call_as_tuple(const Call *call, PyObject **args, PyObject **kwargs)
{
    *kwargs = NULL;
    *args = PyTuple_New(call->nargs);
    if (*args == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < call->nargs; i++)
        PyTuple_SET_ITEM(*args, i, new_ref(call->args[i]));
    if (call->kwnames == NULL || PyTuple_GET_SIZE(call->kwnames) == 0) {
        *kwargs = new_ref(Py_None);
        return 0;
    }
    if ((*kwargs = PyDict_New()) == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(call->kwnames); i++) {
        if (PyDict_SetItem(*kwargs, PyTuple_GET_ITEM(call->kwnames, i), call->args[call->nargs + i]) < 0)
            goto fail;
    }
    return 0;
fail:
    Py_CLEAR(*args);
    Py_CLEAR(*kwargs);
    return -1;
}

static int
parse_ref(PyObject *tuple, ArgRef *ref)
{
    /* (position, keyword) as ops.ArgRef: position -1 with a keyword is keyword-only */
    Py_ssize_t position;
    PyObject *keyword;
    if (!PyArg_ParseTuple(tuple, "nU", &position, &keyword))
        return -1;
    ref->present = position >= 0 || PyUnicode_GET_LENGTH(keyword) > 0;
    ref->position = position >= 0 ? position : PY_SSIZE_T_MAX;
    ref->keyword = PyUnicode_GET_LENGTH(keyword) > 0 ? new_ref(keyword) : NULL;
    return 0;
}

static PyObject *
hot_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *slow, *original, *recorder, *api, *op, *group, *payload, *reduce_op, *async_op, *root;
    PyObject *compiler = Py_None;
    int issues_many;
    static char *kwlist[] = {"slow", "original", "recorder", "api", "op", "group", "payload", "reduce_op",
                             "async_op", "root", "issues_many", "compiler", NULL};
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_hotpath.configure() first");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOUUO!O!O!O!Op|O:Hot", kwlist, &slow, &original, &recorder,
                                     &api, &op, &PyTuple_Type, &group, &PyTuple_Type, &payload, &PyTuple_Type,
                                     &reduce_op, &PyTuple_Type, &async_op, &root, &issues_many, &compiler))
        return NULL;
    Hot *self = (Hot *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(slow);
    self->slow = slow;
    Py_INCREF(original);
    self->original = original;
    Py_INCREF(recorder);
    self->recorder = recorder;
    Py_INCREF(api);
    self->api = api;
    Py_INCREF(op);
    self->op = op;
    self->root = root == Py_None ? NULL : new_ref(root);
    self->issues_many = issues_many;
    if (parse_ref(group, &self->group) < 0 || parse_ref(payload, &self->payload) < 0 ||
        parse_ref(reduce_op, &self->reduce_op) < 0 || parse_ref(async_op, &self->async_op) < 0)
        goto fail;
    if ((self->per_thread = PyObject_GetAttr(recorder, names[A_PER_THREAD])) == NULL ||
        (self->groups = PyObject_GetAttr(recorder, names[A_GROUPS])) == NULL ||
        (self->groups_dict = PyObject_GenericGetDict(self->groups, NULL)) == NULL ||
        (self->queue = PyObject_GetAttr(recorder, names[A_QUEUE])) == NULL ||
        (self->inflight = PyObject_GetAttr(recorder, names[A_INFLIGHT])) == NULL ||
        (self->queue_append = PyObject_GetAttr(self->queue, names[A_APPEND])) == NULL ||
        (self->counters = (Counters *)PyObject_GetAttr(recorder, names[A_COUNTERS])) == NULL ||
        (self->recorder_dict = PyObject_GenericGetDict(recorder, NULL)) == NULL)
        goto fail;
    if (!PyDict_CheckExact(self->recorder_dict) || !PyDict_CheckExact(self->groups_dict)) {
        PyErr_SetString(PyExc_TypeError, "Hot: the recorder and its group registry need an instance dict");
        goto fail;
    }
    if (Py_TYPE(self->counters) != &CountersType) {
        PyErr_SetString(PyExc_TypeError, "Hot: recorder.counters must be a _hotpath.Counters");
        goto fail;
    }
    if (!PyDict_CheckExact(self->inflight)) {
        PyErr_SetString(PyExc_TypeError, "Hot: recorder.inflight must be a dict");
        goto fail;
    }
    if (compiler != Py_None && (self->compiler_dict = PyObject_GenericGetDict(compiler, NULL)) == NULL)
        goto fail;
    PyObject *ring = PyObject_GetAttr(recorder, names[A_RING]);
    if (ring == NULL)
        goto fail;
    if (Py_TYPE(ring) == &RingType)
        self->ring = (struct Ring *)ring;
    else
        Py_DECREF(ring); /* the Python recorder's stand-in: every op as an OpRecord */
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int
hot_traverse(Hot *self, visitproc visit, void *arg)
{
    Py_VISIT(self->slow);
    Py_VISIT(self->root);
    Py_VISIT(self->original);
    Py_VISIT(self->recorder);
    Py_VISIT(self->per_thread);
    Py_VISIT(self->groups);
    Py_VISIT(self->groups_dict);
    Py_VISIT(self->queue);
    Py_VISIT(self->inflight);
    Py_VISIT(self->queue_append);
    Py_VISIT(self->recorder_dict);
    Py_VISIT(self->counters);
    Py_VISIT(self->ring);
    Py_VISIT(self->compiler_dict);
    return 0;
}

static int
hot_clear(Hot *self)
{
    Py_CLEAR(self->slow);
    Py_CLEAR(self->root);
    Py_CLEAR(self->original);
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->api);
    Py_CLEAR(self->op);
    Py_CLEAR(self->group.keyword);
    Py_CLEAR(self->payload.keyword);
    Py_CLEAR(self->reduce_op.keyword);
    Py_CLEAR(self->async_op.keyword);
    Py_CLEAR(self->per_thread);
    Py_CLEAR(self->groups);
    Py_CLEAR(self->groups_dict);
    Py_CLEAR(self->queue);
    Py_CLEAR(self->inflight);
    Py_CLEAR(self->queue_append);
    Py_CLEAR(self->recorder_dict);
    Py_CLEAR(self->counters);
    Py_CLEAR(self->ring);
    Py_CLEAR(self->compiler_dict);
    return 0;
}

static void
hot_dealloc(Hot *self)
{
    PyObject_GC_UnTrack(self);
    hot_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ------------------------------------------------------------------ small helpers */

/* an int's value; -1 with an error set when it is none */
static int
as_ll(PyObject *value, long long *out)
{
    *out = PyLong_AsLongLong(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* a GroupInfo's slot: borrowed, NULL when unset (no error set) */
static inline PyObject *
group_slot(PyObject *info, int slot)
{
    return *(PyObject **)((char *)info + group_offsets[slot]);
}

static int
group_get_ll(PyObject *info, int slot, long long *out)
{
    PyObject *value = group_slot(info, slot);
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "GroupInfo.%s unset", GROUP_SLOTS[slot]);
        return -1;
    }
    return as_ll(value, out);
}

/* a GroupInfo's int slot set to `number` (an int the caller already made: no allocation here) */
static void
group_set(PyObject *info, int slot, PyObject *number)
{
    PyObject **where = (PyObject **)((char *)info + group_offsets[slot]);
    Py_XSETREF(*where, new_ref(number));
}

/* a recorder's attribute (its queue_size), read in its instance dict (no type lookup per access:
 * Recorder defines no descriptor of the name) */
static int
recorder_get_ll(PyObject *dict, int name, long long *out)
{
    PyObject *value = PyDict_GetItemWithError(dict, names[name]);
    if (value == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_AttributeError, "Recorder.%s unset", ATTR_NAMES[name]);
        return -1;
    }
    return as_ll(value, out);
}

/* an OpRecord's slot: borrowed */
static inline PyObject *
record_slot(PyObject *record, int slot)
{
    return *(PyObject **)((char *)record + record_offsets[slot]);
}

static inline void
set_slot(PyObject *record, int slot, PyObject *value) /* steals value */
{
    PyObject **where = (PyObject **)((char *)record + record_offsets[slot]);
    Py_XSETREF(*where, value);
}

static PyObject *
call_slow(Hot *self, const Call *call)
{
    self->delegated++;
    return PyObject_Vectorcall(self->slow, call->args, call->nargs, call->kwnames);
}

/* ------------------------------------------------------------------ Ring: the sync ops of the hot path
 *
 * Ring(capacity): where the hot path writes each sync collective it takes, in place of an OpRecord put in
 * recorder.inflight and, once done, in recorder.queue. A record, its ints, the dict entry and the queue entry
 * were memory each call touched that torch's call does not -- freed in batches by the runtime thread, so
 * cold again when reused: with the three taken out, the added cost of a 4 KiB all_reduce fell from ~6% of
 * the call to ~4% (2-core VM). A slot is a fixed struct in an array made once; the runtime thread makes
 * the OpRecords (drain: the done ones, in order, up to the first still in flight; inflight: copies of those
 * in flight, for heartbeats). Everything runs under the GIL: a slot is written by the training thread
 * between its begin and its end and read by the runtime thread between the two, never during either. When
 * it is full (the runtime fell behind, or one op hangs in flight while other threads issue), the hot path
 * builds an OpRecord as before: nothing is dropped here. */
enum { SLOT_FREE, SLOT_IN_FLIGHT, SLOT_DONE, SLOT_VOID };
typedef struct {
    PyObject *api, *op, *info, *seq, *nbytes, *dtype, *reduce_op; /* owned while taken */
    long long start, end;
    int state;
} Slot;

typedef struct Ring {
    PyObject_HEAD
    Slot *slots;
    unsigned long long mask, head, tail; /* [tail, head) are taken; head - tail <= mask + 1 */
    Py_ssize_t in_flight;
    long long taken, full, lost; /* ops written here / that found it full / whose record could not be made */
    unsigned long generation;    /* fork_generation when made or last reset */
} Ring;

/* In a forked child, the ring's first use forgets the parent's slots: their references stay as they are (held
 * for ever in the child: released, they would be the parent's ops finished here) and no slot of the parent's
 * is completed, drained or copied here. In place: the child's copy of the array is the child's own memory.
 * One compare where nothing forked. */
static inline void
ring_current(struct Ring *self)
{
    if (self->generation == fork_generation)
        return;
    memset(self->slots, 0, (size_t)(self->mask + 1) * sizeof(Slot));
    self->head = self->tail = 0;
    self->in_flight = 0;
    self->taken = self->full = self->lost = 0;
    self->generation = fork_generation;
}

static void
slot_release(Slot *slot)
{
    Py_CLEAR(slot->api);
    Py_CLEAR(slot->op);
    Py_CLEAR(slot->info);
    Py_CLEAR(slot->seq);
    Py_CLEAR(slot->nbytes);
    Py_CLEAR(slot->dtype);
    Py_CLEAR(slot->reduce_op);
    slot->state = SLOT_FREE;
}

static PyObject *
ring_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"capacity", NULL};
    Py_ssize_t capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:Ring", keywords, &capacity))
        return NULL;
    if (capacity < 1 || capacity > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "Ring: capacity from 1 to 2**24");
        return NULL;
    }
    unsigned long long size = 1;
    while (size < (unsigned long long)capacity)
        size <<= 1;
    Ring *self = (Ring *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->slots = PyMem_Calloc(size, sizeof(Slot));
    if (self->slots == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->mask = size - 1;
    self->generation = fork_generation;
    return (PyObject *)self;
}

/* a free slot for the next op, or NULL when full */
static inline Slot *
ring_take(Ring *self)
{
    ring_current(self);
    if (self->head - self->tail > self->mask) {
        self->full++;
        return NULL;
    }
    Slot *slot = &self->slots[self->head & self->mask];
    self->head++;
    self->taken++;
    self->in_flight++;
    slot->state = SLOT_IN_FLIGHT;
    return slot;
}

/* Making an OpRecord allocates a GC-tracked object, which can start a collection whose finalizers run Python
 * code and let another thread take the GIL: a slot is read only after that, and only if it still holds what
 * the caller saw; drain and give_up first move a slot's references out (no call in between), so no thread
 * ever meets a half-released slot. Between those points nothing here calls out: the GIL is held. */

/* the OpRecord of a slot in `state`, as begin() and complete() build it (the slot keeps its references);
 * NULL with no error set when the slot left that state while the record was being allocated */
static PyObject *
slot_record(const Slot *slot, int state)
{
    PyObject *record = record_type->tp_alloc(record_type, 0);
    if (record == NULL)
        return NULL;
    PyObject_GC_UnTrack(record); /* as in begin(): in no reference cycle */
    if (slot->state != state) {
        Py_DECREF(record);
        return NULL;
    }
    PyObject *start = PyLong_FromLongLong(slot->start), *end = PyLong_FromLongLong(slot->end);
    if (start == NULL || end == NULL) {
        Py_XDECREF(start);
        Py_XDECREF(end);
        Py_DECREF(record);
        return NULL;
    }
    set_slot(record, R_API, new_ref(slot->api));
    set_slot(record, R_OP, new_ref(slot->op));
    set_slot(record, R_GROUP, new_ref(slot->info));
    set_slot(record, R_SEQ, new_ref(slot->seq));
    set_slot(record, R_START, start);
    set_slot(record, R_END, end);
    set_slot(record, R_DEVICE, new_ref(Py_False));
    set_slot(record, R_BYTES, new_ref(slot->nbytes));
    set_slot(record, R_DTYPE, new_ref(slot->dtype));
    set_slot(record, R_REDUCE, new_ref(slot->reduce_op));
    set_slot(record, R_ASYNC, new_ref(Py_False));
    set_slot(record, R_STATE, new_ref(state == SLOT_DONE ? state_completed : state_in_flight));
    return record;
}

/* the slot's op moved out to `into` (its references with it), the slot left in `state` */
static inline void
slot_move(Slot *slot, Slot *into, int state)
{
    *into = *slot;
    memset(slot, 0, sizeof(Slot));
    slot->state = state;
}

/* the in-flight slot's op as an OpRecord of its own, the slot given up whatever happens (an op that failed
 * goes the record's way); NULL with an error when the record could not be made */
static PyObject *
ring_give_up(Ring *self, Slot *slot)
{
    Slot op;
    slot_move(slot, &op, SLOT_VOID); /* drain steps over it */
    self->in_flight--;
    PyObject *record = slot_record(&op, SLOT_IN_FLIGHT);
    slot_release(&op);
    if (record == NULL && !PyErr_Occurred())
        PyErr_NoMemory();
    return record;
}

/* Ring.drain(): the done ops as OpRecords, oldest first, up to the first op still in flight. An op whose
 * record cannot be made (out of memory) is counted in `lost`. */
static PyObject *
ring_drain(Ring *self, PyObject *Py_UNUSED(ignored))
{
    ring_current(self);
    PyObject *records = PyList_New(0);
    if (records == NULL)
        return NULL;
    while (self->tail != self->head) {
        Slot *slot = &self->slots[self->tail & self->mask];
        if (slot->state == SLOT_IN_FLIGHT)
            break;
        Slot op;
        slot_move(slot, &op, SLOT_FREE);
        self->tail++;
        if (op.state == SLOT_DONE) {
            PyObject *record = slot_record(&op, SLOT_DONE);
            if (record == NULL || PyList_Append(records, record) < 0) {
                self->lost++;
                if (clear_ours() < 0) { /* not ours to swallow: out, the ops drained so far lost with it */
                    Py_XDECREF(record);
                    slot_release(&op);
                    self->lost += PyList_GET_SIZE(records);
                    Py_DECREF(records);
                    return NULL;
                }
            }
            Py_XDECREF(record);
        }
        slot_release(&op);
    }
    return records;
}

/* copies of the slots in `state`, as OpRecords, oldest first (the slots keep their ops) */
static PyObject *
ring_copies(Ring *self, int state)
{
    ring_current(self);
    PyObject *records = PyList_New(0);
    if (records == NULL)
        return NULL;
    unsigned long long at = self->tail;
    while (at != self->head) {
        if (at < self->tail) { /* drained by another thread meanwhile */
            at = self->tail;
            continue;
        }
        Slot *slot = &self->slots[at++ & self->mask];
        if (slot->state != state)
            continue;
        PyObject *record = slot_record(slot, state);
        if (record == NULL) {
            if (!PyErr_Occurred())
                continue; /* it left that state meanwhile */
            Py_DECREF(records);
            return NULL;
        }
        int appended = PyList_Append(records, record);
        Py_DECREF(record);
        if (appended < 0) {
            Py_DECREF(records);
            return NULL;
        }
    }
    return records;
}

static PyObject *
ring_inflight(Ring *self, PyObject *Py_UNUSED(ignored))
{
    return ring_copies(self, SLOT_IN_FLIGHT);
}

static PyObject *
ring_done(Ring *self, PyObject *Py_UNUSED(ignored))
{
    return ring_copies(self, SLOT_DONE);
}

static Py_ssize_t
ring_len(Ring *self)
{
    ring_current(self);
    return (Py_ssize_t)(self->head - self->tail);
}

static int
ring_traverse(Ring *self, visitproc visit, void *arg)
{
    for (unsigned long long at = self->tail; at != self->head; at++) {
        Slot *slot = &self->slots[at & self->mask];
        Py_VISIT(slot->info);
        Py_VISIT(slot->dtype);
        Py_VISIT(slot->reduce_op);
    }
    return 0;
}

static int
ring_clear(Ring *self)
{
    if (self->slots == NULL)
        return 0;
    ring_current(self);
    for (unsigned long long at = self->tail; at != self->head; at++)
        slot_release(&self->slots[at & self->mask]);
    self->tail = self->head;
    self->in_flight = 0;
    return 0;
}

static void
ring_dealloc(Ring *self)
{
    PyObject_GC_UnTrack(self);
    ring_clear(self);
    PyMem_Free(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef ring_methods[] = {
    {"drain", (PyCFunction)ring_drain, METH_NOARGS,
     "the done ops as OpRecords, oldest first, up to the first still in flight (they leave the ring)"},
    {"inflight", (PyCFunction)ring_inflight, METH_NOARGS, "copies of the ops in flight, as OpRecords"},
    {"done", (PyCFunction)ring_done, METH_NOARGS, "copies of the done ops not yet drained, as OpRecords"},
    {NULL, NULL, 0, NULL},
};

/* the counts, read as this process's (a forked child's ring forgets its parent's first) */
static PyObject *
ring_get_in_flight(Ring *self, void *Py_UNUSED(closure))
{
    ring_current(self);
    return PyLong_FromSsize_t(self->in_flight);
}

static PyObject *
ring_get_count(Ring *self, void *closure)
{
    ring_current(self);
    return PyLong_FromLongLong(*(long long *)((char *)self + (Py_ssize_t)closure));
}

static PyGetSetDef ring_getset[] = {
    {"in_flight", (getter)ring_get_in_flight, NULL, "ops in flight in the ring", NULL},
    {"taken", (getter)ring_get_count, NULL, "ops the hot path wrote here", (void *)offsetof(Ring, taken)},
    {"full", (getter)ring_get_count, NULL, "ops that found the ring full (recorded as OpRecords)",
     (void *)offsetof(Ring, full)},
    {"lost", (getter)ring_get_count, NULL, "done ops whose OpRecord could not be made (no memory)",
     (void *)offsetof(Ring, lost)},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods ring_as_sequence = {.sq_length = (lenfunc)ring_len};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mycroft.instrumentation._hotpath.Ring",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = ring_new,
    .tp_traverse = (traverseproc)ring_traverse,
    .tp_clear = (inquiry)ring_clear,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_methods = ring_methods,
    .tp_getset = ring_getset,
    .tp_as_sequence = &ring_as_sequence,
    .tp_doc = "The hot path's sync ops, in fixed slots: Ring(capacity); len() is the ops not yet drained.",
};

/* ------------------------------------------------------------------ the payload's bytes and dtype
 *
 * Tensor.nbytes and Tensor.dtype are getset descriptors of torch._C.TensorBase. Generic attribute lookup
 * finds the descriptor through the type's method cache and checks the instance's type against it before
 * calling its getter: ~0.5 us of the ~1.6 us the two reads cost here after a collective has left the caches
 * cold (2-core VM). The getters of the last payload type are remembered with the type's version tag (reset
 * by CPython when the type or a base changes) and called directly, which is what the generic lookup ends
 * in; a type with its own __getattribute__, or whose attributes are not getset descriptors, takes the
 * generic lookup. */
typedef struct {
    PyTypeObject *type; /* strong */
    unsigned int version;
    PyGetSetDef *nbytes, *dtype;
} PayloadGetters;
static PayloadGetters payload_getters;

static PyGetSetDef *
getset_of(PyTypeObject *type, PyObject *name)
{
    PyObject *descr = PyObject_GetAttr((PyObject *)type, name); /* the class attribute: the descriptor itself */
    if (descr == NULL) {
        clear_ours(); /* a metaclass's Python code: anything else than an Exception stays set */
        return NULL;
    }
    PyGetSetDef *def = Py_TYPE(descr) == &PyGetSetDescr_Type ? ((PyGetSetDescrObject *)descr)->d_getset : NULL;
    Py_DECREF(descr); /* the type keeps it (and its PyGetSetDef is static in the extension) */
    return def != NULL && def->get != NULL ? def : NULL;
}

/* 1 with the getters of `type`, remembered; 0 where the generic lookup must read them; -1 with a
 * BaseException that is no Exception set (raised by a metaclass's code) */
static int
payload_getters_for(PyTypeObject *type)
{
    if (type == payload_getters.type && type->tp_version_tag == payload_getters.version && payload_getters.version)
        return 1;
    if (type->tp_getattro != PyObject_GenericGetAttr)
        return 0;
    PyGetSetDef *nbytes = getset_of(type, names[A_NBYTES]);
    PyGetSetDef *dtype = PyErr_Occurred() ? NULL : getset_of(type, names[A_DTYPE]);
    if (PyErr_Occurred())
        return -1;
    if (nbytes == NULL || dtype == NULL || type->tp_version_tag == 0)
        return 0;
    Py_INCREF(type);
    PyTypeObject *old = payload_getters.type;
    payload_getters = (PayloadGetters){type, type->tp_version_tag, nbytes, dtype};
    Py_XDECREF(old);
    return 1;
}

/* GroupInfo.deref(): the group, a new reference; NULL once torch let it go (an error may be set). A
 * registered group is held weakly: its referent is read in place instead of calling the weakref. */
static PyObject *
group_object(PyObject *deref)
{
    PyObject *pg;
    if (!PyWeakref_CheckRefExact(deref)) {
        pg = PyObject_CallNoArgs(deref);
    } else {
#if PY_VERSION_HEX >= 0x030D0000
        if (PyWeakref_GetRef(deref, &pg) < 0)
            pg = NULL;
#else
        pg = new_ref(PyWeakref_GET_OBJECT(deref));
#endif
    }
    if (pg == Py_None)
        Py_CLEAR(pg);
    return pg;
}

/* ------------------------------------------------------------------ begin
 *
 * What Recorder.beginner's `begin` does for this call: 1 with `out` filled; 0, no error set and no state
 * touched, when the Python wrapper must take the call (it meets any error of ours again and counts it); -1, no
 * state touched, with a BaseException that is no Exception set (raised by Python code it ran): it leaves the
 * call, torch's function is not called (see clear_ours). */
typedef struct {
    PyObject *record; /* the op as an OpRecord, or NULL: in `slot` */
    Slot *slot;
    PyObject *info;
    long long seq, start;
    int async_op;
    unsigned long generation; /* fork_generation at begin: another at the end, the op is a parent's (fork) */
} Begun;

/* no op in flight, as an OpRecord or in the ring (the start of communication time) */
static inline int
nothing_in_flight(Hot *self)
{
    if (self->ring != NULL)
        ring_current(self->ring);
    return PyDict_GET_SIZE(self->inflight) == 0 && (self->ring == NULL || self->ring->in_flight == 0);
}

static int
begin(Hot *self, const Call *call, Begun *out)
{
    PyObject *info = NULL, *pg = NULL, *nbytes = NULL, *dtype = NULL, *record = NULL;
    PyObject *group = argument(call, &self->group);
    /* GroupRegistry's attributes, read in its instance dict (it defines no descriptor of these names) */
    if (group == NULL || group == Py_None) {
        /* None until resolved: the Python path resolves it */
        info = PyDict_GetItemWithError(self->groups_dict, names[A_DEFAULT]);
    } else {
        PyObject *by_pg = PyDict_GetItemWithError(self->groups_dict, names[A_BY_PG]);
        PyObject *key = by_pg != NULL ? PyLong_FromVoidPtr(group) : NULL; /* id(group) */
        info = key != NULL && PyDict_Check(by_pg) ? PyDict_GetItemWithError(by_pg, key) : NULL;
        Py_XDECREF(key);
    }
    Py_XINCREF(info);
    if (info == NULL || Py_TYPE(info) != group_type)
        goto delegate;
    /* the group object behind the info: the registered one (an id can be reused) */
    PyObject *deref = group_slot(info, G_DEREF);
    if (deref == NULL)
        goto delegate;
    pg = group_object(deref);
    if (pg == NULL)
        goto delegate;
    if (group != NULL && group != Py_None && pg != group)
        goto delegate;
    /* ops that complete on the device, or a group without torch's counter: the Python path */
    if (group_slot(info, G_DEVICE_ASYNC) != Py_False || group_slot(info, G_HAS_COUNTER) != Py_True)
        goto delegate;

    /* the payload: a tensor's bytes and dtype; anything else through payload_info */
    if (self->payload.present) {
        PyObject *payload = argument(call, &self->payload);
        if (payload == NULL)
            payload = Py_None;
        int getters = payload_getters_for(Py_TYPE(payload));
        if (getters < 0)
            goto delegate;
        if (getters) {
            nbytes = payload_getters.nbytes->get(payload, payload_getters.nbytes->closure);
            if (nbytes != NULL)
                dtype = payload_getters.dtype->get(payload, payload_getters.dtype->closure);
        } else {
            nbytes = PyObject_GetAttr(payload, names[A_NBYTES]);
            if (nbytes != NULL)
                dtype = PyObject_GetAttr(payload, names[A_DTYPE]);
        }
        if (nbytes == NULL || dtype == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                goto delegate;
            PyErr_Clear();
            Py_CLEAR(nbytes);
            PyObject *pair = PyObject_CallOneArg(payload_info, payload);
            if (pair == NULL)
                goto delegate;
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
                Py_DECREF(pair);
                goto delegate;
            }
            nbytes = new_ref(PyTuple_GET_ITEM(pair, 0));
            dtype = new_ref(PyTuple_GET_ITEM(pair, 1));
            Py_DECREF(pair);
        }
    } else {
        nbytes = new_ref(zero);
        dtype = new_ref(Py_None);
    }
    PyObject *reduce_op = Py_None;
    if (self->reduce_op.keyword != NULL) {
        reduce_op = argument(call, &self->reduce_op);
        if (reduce_op == NULL)
            reduce_op = Py_None;
    }
    int async_op = 0;
    if (self->async_op.keyword != NULL) {
        PyObject *flag = argument(call, &self->async_op);
        if (flag != NULL && (async_op = PyObject_IsTrue(flag)) < 0)
            goto delegate;
    }

    /* the seq torch will give it: its counter, less our p2p ops' share, plus one */
    long long start = now_ns();
    PyObject *seq_of = group_slot(info, G_SEQ_OF);
    if (seq_of == NULL || seq_of == Py_None)
        goto delegate;
    PyObject *counter_now = PyObject_CallOneArg(seq_of, pg);
    if (counter_now == NULL) /* no counter on this backend after all: the Python path notes it */
        goto delegate;
    long long torch_seq = PyLong_AsLongLong(counter_now);
    Py_DECREF(counter_now);
    if (torch_seq == -1 && PyErr_Occurred())
        goto delegate;
    long long delta;
    if (group_get_ll(info, G_P2P_DELTA, &delta) < 0)
        goto delegate;
    long long seq = torch_seq - delta + 1;

    /* a sync op in the ring (any op else, or a full ring: an OpRecord) */
    Slot *slot = NULL;
    if (self->ring != NULL && !async_op && self->root == NULL && !self->issues_many) {
        PyObject *seq_obj = PyLong_FromLongLong(seq);
        if (seq_obj == NULL)
            goto delegate;
        int idle = nothing_in_flight(self);
        slot = ring_take(self->ring);
        if (slot == NULL) {
            Py_DECREF(seq_obj);
        } else { /* from here on state changes: nothing below delegates */
            slot->api = new_ref(self->api);
            slot->op = new_ref(self->op);
            slot->info = new_ref(info);
            slot->seq = seq_obj;
            slot->nbytes = nbytes;
            slot->dtype = dtype;
            slot->reduce_op = new_ref(reduce_op);
            slot->start = start;
            slot->end = 0;
            group_set(info, G_ISSUED, seq_obj);
            if (idle)
                self->counters->comm_since_ns = start;
            self->counters->last_activity_ns = start;
            Py_DECREF(pg);
            *out = (Begun){NULL, slot, info, seq, start, 0, fork_generation};
            return 1;
        }
    }

    /* the record, built as OpRecord.__init__ builds it (tests compare the two) */
    record = record_type->tp_alloc(record_type, 0);
    if (record == NULL)
        goto delegate;
    /* a record refers to no record (group info, ints, strs, a dtype): it is in no reference cycle, so the
     * cyclic GC need not track it. Tracked, the records waiting in the queue for the runtime were a
     * fifth of this call's time here (every collection walked them, and promoted them to older ones). */
    PyObject_GC_UnTrack(record);
    PyObject *seq_obj = PyLong_FromLongLong(seq), *start_obj = PyLong_FromLongLong(start);
    if (seq_obj == NULL || start_obj == NULL) {
        Py_XDECREF(seq_obj);
        Py_XDECREF(start_obj);
        goto delegate;
    }
    set_slot(record, R_API, new_ref(self->api));
    set_slot(record, R_OP, new_ref(self->op));
    set_slot(record, R_GROUP, new_ref(info));
    set_slot(record, R_SEQ, seq_obj);
    set_slot(record, R_START, start_obj);
    set_slot(record, R_END, new_ref(zero));
    set_slot(record, R_DEVICE, new_ref(Py_False));
    set_slot(record, R_BYTES, nbytes);
    nbytes = NULL;
    set_slot(record, R_DTYPE, dtype);
    dtype = NULL;
    set_slot(record, R_REDUCE, new_ref(reduce_op));
    set_slot(record, R_ASYNC, new_ref(async_op ? Py_True : Py_False));
    set_slot(record, R_STATE, new_ref(state_in_flight));
    if (self->root != NULL) { /* rare (broadcast, reduce, gather, scatter): the Python helper reads the root */
        PyObject *args, *kwargs;
        if (call_as_tuple(call, &args, &kwargs) < 0)
            goto delegate;
        PyObject *done = PyObject_CallFunctionObjArgs(self->root, record, info, args, kwargs, NULL);
        Py_DECREF(args);
        Py_DECREF(kwargs);
        if (done == NULL)
            goto delegate;
        Py_DECREF(done);
    }

    /* from here on state changes: nothing below delegates */
    group_set(info, G_ISSUED, seq_obj);
    if (nothing_in_flight(self))
        self->counters->comm_since_ns = start;
    if (PyDict_SetItem(self->inflight, record, record) < 0)
        goto delegate;
    /* in flight now: the call is ours whatever happens next (the Python path would record it twice) */
    self->counters->last_activity_ns = start;
    Py_DECREF(pg);
    out->record = record;
    out->info = info;
    out->seq = seq;
    out->start = start;
    out->async_op = async_op;
    out->generation = fork_generation;
    return 1;

delegate:;
    int stop = clear_ours();
    Py_XDECREF(record); /* deallocations run no code that could raise here (an error set stays set) */
    Py_XDECREF(nbytes);
    Py_XDECREF(dtype);
    Py_XDECREF(pg);
    Py_XDECREF(info);
    return stop;
}

/* ------------------------------------------------------------------ complete: Recorder.complete(record) */

/* both paths at an op's end: GroupInfo.completed raised to the op's seq (`seq_obj`, the int already made) */
static int
group_completed(PyObject *info, long long seq, PyObject *seq_obj)
{
    long long completed;
    if (group_get_ll(info, G_COMPLETED, &completed) < 0)
        return -1;
    if (seq > completed)
        group_set(info, G_COMPLETED, seq_obj);
    return 0;
}

/* both paths: an op left flight at `end` (taken out of the dict or the ring first): one more done, and the
 * communication time closed when nothing else is in flight */
static void
left_flight(Hot *self, long long end)
{
    Counters *counters = self->counters;
    counters->ops_done++;
    if (nothing_in_flight(self) && end > counters->comm_since_ns)
        counters->comm_ns += end - counters->comm_since_ns;
}

/* a sync op of the ring done: what complete() does to its record, in the slot (the runtime queues it) */
static int
complete_slot(Hot *self, Begun *op)
{
    Slot *slot = op->slot;
    long long end = now_ns();
    slot->end = end;
    slot->state = SLOT_DONE;
    self->ring->in_flight--;
    left_flight(self, end);
    self->counters->last_activity_ns = end;
    return group_completed(op->info, op->seq, slot->seq);
}

static int
complete(Hot *self, Begun *op)
{
    PyObject *record = op->record;
    long long end = now_ns();
    PyObject *end_obj = PyLong_FromLongLong(end);
    if (end_obj == NULL)
        return -1;
    set_slot(record, R_END, end_obj);
    set_slot(record, R_STATE, new_ref(state_completed));
    if (group_completed(op->info, op->seq, record_slot(record, R_SEQ)) < 0)
        return -1;
    if (PyDict_DelItem(self->inflight, record) < 0) { /* one lookup: begin() put it there */
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            return -1;
        PyErr_Clear();
    } else {
        left_flight(self, end);
    }
    self->counters->last_activity_ns = end;
    PyObject *result;
    long long queue_size;
    if (recorder_get_ll(self->recorder_dict, A_QUEUE_SIZE, &queue_size) < 0)
        return -1;
    if (PySequence_Size(self->queue) < queue_size)
        result = PyObject_CallOneArg(self->queue_append, record);
    else
        result = PyObject_CallMethodOneArg(self->recorder, names[A_PUSH], record);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

/* ------------------------------------------------------------------ the call */

/* This thread's _Depth (PerThread.depth), remembered with the PerThread it came from and the Python thread
 * state it was read in. Each read through the threading.local is a lookup in the thread's state, a type lookup
 * and a descriptor call: ~1 us a call after a collective has left the caches cold (2-core VM). Keyed as Python
 * keys a threading.local, by the thread state, not by the OS thread: a C++ thread that enters Python with a new
 * thread state each time (torch's Future.then callbacks on gloo's threads, pybind11's gil_scoped_acquire) has
 * a new PerThread each time, which the Python wrapper reads; remembered per OS thread, the C path went on
 * using the first one's _Depth, and a nested wrapped call was recorded twice with one seq. A thread state's
 * id is unique for the interpreter's life (its address is not: a freed one is reused at once). A _Depth is
 * made once per PerThread and thread state and never replaced; both references are held, so neither address
 * can be reused while remembered. A thread that ends leaves its two references behind (two small objects). */
static _Thread_local PyObject *remembered_per_thread, *remembered_depth;
static _Thread_local uint64_t remembered_thread_state;

/* a new reference; NULL, no error set: the Python path must take the call; NULL with an error set: a
 * BaseException that is no Exception, raised by PerThread's __init__ (this thread state's first read) */
static PyObject *
thread_depth(Hot *self)
{
    uint64_t thread_state = PyThreadState_GetID(PyThreadState_Get());
    if (remembered_per_thread == self->per_thread && remembered_thread_state == thread_state)
        return new_ref(remembered_depth);
    PyObject *depth = PyObject_GetAttr(self->per_thread, names[A_DEPTH]);
    if (depth == NULL || Py_TYPE(depth) != depth_type) {
        Py_XDECREF(depth);
        clear_ours();
        return NULL;
    }
    PyObject *old_per_thread = remembered_per_thread, *old_depth = remembered_depth;
    remembered_per_thread = new_ref(self->per_thread);
    remembered_depth = new_ref(depth);
    remembered_thread_state = thread_state;
    Py_XDECREF(old_per_thread); /* last: their deallocation may run Python code */
    Py_XDECREF(old_depth);
    return depth;
}

/* _Depth.value, read in place; -1 when it is not a small int (no error set; an exact int runs no code) */
static long
depth_value(PyObject *depth)
{
    PyObject *value = *(PyObject **)((char *)depth + depth_value_offset);
    if (value == NULL || !PyLong_CheckExact(value))
        return -1;
    long now = PyLong_AsLong(value);
    if (now == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* OverflowError */
        return -1;
    }
    return now;
}

/* _Depth.value += delta, in place (ints this small are CPython's shared ones: nothing allocated) */
static PyObject *
set_depth(PyObject *depth, long delta)
{
    long now = depth_value(depth);
    if (now < 0) {
        PyErr_SetString(PyExc_TypeError, "_Depth.value is not an int");
        return NULL;
    }
    PyObject *next = PyLong_FromLong(now + delta);
    if (next == NULL)
        return NULL;
    PyObject **where = (PyObject **)((char *)depth + depth_value_offset);
    Py_XSETREF(*where, next);
    return depth;
}

/* A BaseException that is no Exception, met after torch's call began: kept aside while the bookkeeping goes
 * on (no call is made with an error set), then raised from the call (the first one; any later one is dropped,
 * as a second Ctrl-C during an except block would replace the first). */
typedef struct {
    PyObject *type, *value, *tb;
} Stop;

static void
stop_keep(Stop *stop)
{
    if (stop->type == NULL) {
        PyErr_Fetch(&stop->type, &stop->value, &stop->tb);
        PyErr_NormalizeException(&stop->type, &stop->value, &stop->tb);
        if (stop->value != NULL && stop->tb != NULL)
            PyException_SetTraceback(stop->value, stop->tb);
    } else {
        PyErr_Clear();
    }
}

/* Recorder._note_error through the Python path: count it once there, never into training. An error that is
 * not an Exception is not ours to note: it goes to `stop`, as does one that the note itself raises. */
static void
note_error(Hot *self, const char *where, Stop *stop)
{
    PyObject *pending = PyErr_Occurred();
    if (pending != NULL && !PyErr_GivenExceptionMatches(pending, PyExc_Exception)) {
        stop_keep(stop);
        return;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *result = PyObject_CallMethod(self->recorder, "_note_error", "sO", where, value ? value : Py_None);
    if (result == NULL && clear_ours() < 0)
        stop_keep(stop);
    Py_XDECREF(result);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

static PyObject *
hot_call(Hot *self, const Call *call)
{
    if (self->compiler_dict != NULL) { /* traced by torch.export or AOT: torch's call alone, as Dynamo's is */
        PyObject *tracing = PyDict_GetItemWithError(self->compiler_dict, names[A_COMPILING_FLAG]);
        if (tracing == Py_True)
            return PyObject_Vectorcall(self->original, call->args, call->nargs, call->kwnames);
        if (tracing == NULL && clear_ours() < 0) /* a str key in a module's dict: runs no code, in fact */
            return NULL;
    }
    PyObject *depth = thread_depth(self);
    if (depth == NULL)
        return PyErr_Occurred() ? NULL : call_slow(self, call);
    if (depth_value(depth) != 0) { /* inside another wrapped call (or unreadable): the Python path decides */
        Py_DECREF(depth);
        return call_slow(self, call);
    }
    Begun op = {0};
    int begun = begin(self, call, &op);
    if (begun <= 0) {
        Py_DECREF(depth);
        return begun < 0 ? NULL : call_slow(self, call);
    }
    self->handled++;
    Stop stop = {NULL, NULL, NULL};
    if (set_depth(depth, 1) == NULL)
        note_error(self, "depth", &stop);
    PyObject *result = NULL;
    if (stop.type == NULL) {
        result = PyObject_Vectorcall(self->original, call->args, call->nargs, call->kwnames);
    } else { /* a stop before torch's call: the call is not made, the op fails with the stop */
        PyErr_Restore(stop.type, stop.value, stop.tb);
        stop = (Stop){NULL, NULL, NULL};
    }
    int ours = op.generation == fork_generation; /* else the op is a parent's, returning in a forked child */
    if (result == NULL) {
        /* the op failed: Recorder.failed(record, exc), then the same exception goes on */
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (exc != NULL && tb != NULL)
            PyException_SetTraceback(exc, tb);
        if (ours && op.slot != NULL) { /* the record's way: in recorder.inflight, Recorder.failed completes it */
            op.record = ring_give_up(self->ring, op.slot);
            if (op.record != NULL && PyDict_SetItem(self->inflight, op.record, op.record) < 0)
                Py_CLEAR(op.record);
            if (op.record == NULL && clear_ours() < 0) /* MemoryError: the op unrecorded */
                stop_keep(&stop);
        }
        PyObject *failed = !ours || op.record == NULL ? NULL :
            PyObject_CallMethodObjArgs(self->recorder, names[A_FAILED], op.record, exc ? exc : Py_None, NULL);
        if (failed == NULL && PyErr_Occurred() && clear_ours() < 0)
            stop_keep(&stop);
        Py_XDECREF(failed);
        if (set_depth(depth, -1) == NULL)
            PyErr_Clear(); /* a TypeError of set_depth's own: no code ran */
        if (stop.type == NULL) {
            PyErr_Restore(type, exc, tb);
        } else { /* the stop goes on, the call's own error as its context */
            if (stop.value != NULL && exc != NULL && stop.value != exc)
                PyException_SetContext(stop.value, new_ref(exc));
            Py_XDECREF(type);
            Py_XDECREF(exc);
            Py_XDECREF(tb);
        }
        goto done;
    }
    if (set_depth(depth, -1) == NULL)
        note_error(self, "depth", &stop);
    if (!ours) {
        /* forked inside torch's call: the op is the parent's (its ring slot and its record were forgotten here
         * at the fork); the child neither completes nor queues it */
    } else if (op.slot != NULL) {
        if (complete_slot(self, &op) < 0)
            note_error(self, "complete", &stop);
    } else if (!op.async_op) {
        if (complete(self, &op) < 0)
            note_error(self, "complete", &stop);
        if (self->issues_many) {
            PyObject *through = PyObject_CallMethodOneArg(self->recorder, names[A_COMPLETE_THROUGH], op.record);
            if (through == NULL)
                note_error(self, "complete_through_call", &stop);
            Py_XDECREF(through);
        }
    } else {
        PyObject *issued = PyObject_CallMethodObjArgs(self->recorder, names[A_ISSUED_CALL], op.record, result, NULL);
        if (issued == NULL)
            note_error(self, "issued", &stop);
        Py_XDECREF(issued);
    }
done:
    Py_DECREF(depth);
    Py_XDECREF(op.record);
    Py_DECREF(op.info);
    if (stop.type != NULL) { /* out of the call as without Mycroft: the collective's result with it */
        Py_CLEAR(result);
        PyErr_Restore(stop.type, stop.value, stop.tb);
    }
    return result;
}

static PyObject *
hot_counts(Hot *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(LL)", self->handled, self->delegated);
}

static PyMethodDef hot_methods[] = {
    {"counts", (PyCFunction)hot_counts, METH_NOARGS, "(calls handled here, calls handed to the Python wrapper)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mycroft.instrumentation._hotpath.Hot",
    .tp_basicsize = sizeof(Hot),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = hot_new,
    .tp_traverse = (traverseproc)hot_traverse,
    .tp_clear = (inquiry)hot_clear,
    .tp_dealloc = (destructor)hot_dealloc,
    .tp_methods = hot_methods,
    .tp_doc = "One wrapped collective's fast path; a Door calls it.",
};

/* ------------------------------------------------------------------ Door: the function torch.distributed gets
 *
 * A builtin function (METH_FASTCALL | METH_KEYWORDS) bound to a Door, which hands every call to its Hot, or to
 * torch's function while it has none. A Python function in between (the shim this replaced: a frame, *args /
 * **kwargs packed, a test for Dynamo) was ~1 us of each call after a collective (2-core VM, slow phase).
 * Dynamo cannot trace a builtin: doors.py registers a Python stand-in for it
 * (torch.compiler.substitute_in_graph) that calls torch's function, which is what Dynamo traced in the shim.
 * One Door per torch function for the life of the process (doors.py keeps them): what Dynamo registered by
 * identity stays valid, and a new recorder only swaps the Hot. */
typedef struct {
    PyObject_HEAD
    PyObject *original; /* torch's function */
    PyObject *hot;      /* a Hot, or NULL: torch's function alone */
    PyObject *name;     /* bytes: def.ml_name points into it */
    PyObject *doc;      /* bytes or NULL: def.ml_doc */
    PyObject *module;   /* str: the module whose attribute `name` the door stands for */
    PyMethodDef def;
} Door;

static PyObject *
door_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Door *door = (Door *)self;
    PyObject *hot = door->hot;
    if (hot == NULL)
        return PyObject_Vectorcall(door->original, args, nargs, kwnames);
    Py_INCREF(hot); /* another thread may swap it during the call */
    Call call = {args, nargs, kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0 ? kwnames : NULL};
    PyObject *result = hot_call((Hot *)hot, &call);
    Py_DECREF(hot);
    return result;
}

static PyObject *
door_get_hot(Door *self, void *Py_UNUSED(closure))
{
    return new_ref(self->hot != NULL ? self->hot : Py_None);
}

static int
door_set_hot(Door *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value != NULL && value != Py_None && Py_TYPE(value) != &HotType) {
        PyErr_SetString(PyExc_TypeError, "Door.hot: a Hot or None");
        return -1;
    }
    PyObject *hot = value == NULL || value == Py_None ? NULL : new_ref(value);
    Py_XSETREF(self->hot, hot);
    return 0;
}

static PyObject *
door_get_original(Door *self, void *Py_UNUSED(closure))
{
    return new_ref(self->original);
}

/* A door pickles as its builtin does, (getattr, (door, name)), and the door as the module it stands in:
 * unpickled, the name is looked up there (the door where that process is instrumented, torch's function
 * where not), as a Python function of that module would be (Ray and multiprocessing pickle callables). */
static PyObject *
door_reduce(Door *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *importlib = PyImport_ImportModule("importlib");
    if (importlib == NULL)
        return NULL;
    PyObject *import_module = PyObject_GetAttrString(importlib, "import_module");
    Py_DECREF(importlib);
    if (import_module == NULL)
        return NULL;
    PyObject *reduced = Py_BuildValue("(N(O))", import_module, self->module);
    return reduced;
}

static PyMethodDef door_methods[] = {
    {"__reduce__", (PyCFunction)door_reduce, METH_NOARGS, "pickled as the module it stands in"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef door_getset[] = {
    {"hot", (getter)door_get_hot, (setter)door_set_hot, "the Hot taking the calls, or None: torch's function alone",
     NULL},
    {"original", (getter)door_get_original, NULL, "torch's function", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static int
door_traverse(Door *self, visitproc visit, void *arg)
{
    Py_VISIT(self->original);
    Py_VISIT(self->hot);
    return 0;
}

static int
door_clear(Door *self)
{
    Py_CLEAR(self->original);
    Py_CLEAR(self->hot);
    return 0;
}

static void
door_dealloc(Door *self)
{
    PyObject_GC_UnTrack(self);
    door_clear(self);
    Py_CLEAR(self->name);
    Py_CLEAR(self->doc);
    Py_CLEAR(self->module);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject DoorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mycroft.instrumentation._hotpath.Door",
    .tp_basicsize = sizeof(Door),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)door_traverse,
    .tp_clear = (inquiry)door_clear,
    .tp_dealloc = (destructor)door_dealloc,
    .tp_getset = door_getset,
    .tp_methods = door_methods,
    .tp_doc = "What a door function calls: its Hot, or torch's function (door.__self__).",
};

/* door(original, name, module, doc=None) -> a builtin function named `name` in `module` (its __doc__ `doc`),
 * bound to a new Door */
static PyObject *
make_door(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *original, *name, *module_name, *doc = Py_None;
    if (!PyArg_ParseTuple(args, "OUU|O:door", &original, &name, &module_name, &doc))
        return NULL;
    if (doc != Py_None && !PyUnicode_Check(doc)) {
        PyErr_SetString(PyExc_TypeError, "door: doc must be a str or None");
        return NULL;
    }
    if (!PyCallable_Check(original)) {
        PyErr_SetString(PyExc_TypeError, "door: original must be callable");
        return NULL;
    }
    Door *door = PyObject_GC_New(Door, &DoorType);
    if (door == NULL)
        return NULL;
    door->original = new_ref(original);
    door->hot = NULL;
    door->doc = NULL;
    door->module = new_ref(module_name);
    door->name = PyUnicode_AsUTF8String(name);
    if (door->name == NULL || (doc != Py_None && (door->doc = PyUnicode_AsUTF8String(doc)) == NULL)) {
        Py_DECREF(door);
        return NULL;
    }
    door->def = (PyMethodDef){PyBytes_AS_STRING(door->name), (PyCFunction)(void (*)(void))door_call,
                              METH_FASTCALL | METH_KEYWORDS, door->doc ? PyBytes_AS_STRING(door->doc) : NULL};
    PyObject_GC_Track(door);
    PyObject *function = PyCFunction_NewEx(&door->def, (PyObject *)door, module_name);
    Py_DECREF(door); /* the function holds it */
    return function;
}

/* ------------------------------------------------------------------ Work.wait */

/* Wait(original, waiters): torch's Work.wait, unchanged, with `waiters` (Recorder.waiters, a deque)
 * one longer while a thread is inside it (Recorder.posted_only). Every sync collective's call
 * crosses it (torch's sync path is `work = <async op>; work.wait()`); the Python wrapper it
 * replaces was ~0.5 us of each. A method descriptor, so `work.wait()` binds like a function's. */
typedef struct {
    PyObject_HEAD
    PyObject *original;
    PyObject *append; /* waiters.append */
    PyObject *pop;    /* waiters.pop */
    PyObject *dict;   /* the Patcher marks what it installed */
    vectorcallfunc vectorcall;
} Wait;

static PyObject *
wait_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Wait *self = (Wait *)callable;
    PyObject *entered = PyObject_CallOneArg(self->append, Py_None);
    if (entered == NULL)
        return NULL;
    Py_DECREF(entered);
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback); /* the call's own error, if any, survives the pop */
    PyObject *left = PyObject_CallNoArgs(self->pop);
    if (left == NULL) { /* never raised by a deque we appended to; keep the call's outcome */
        if (clear_ours() < 0) { /* not ours to swallow: it leaves the call instead */
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
            Py_XDECREF(result);
            return NULL;
        }
    } else {
        Py_DECREF(left);
    }
    PyErr_Restore(type, value, traceback);
    return result;
}

static PyObject *
wait_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"original", "waiters", NULL};
    PyObject *original, *waiters;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:Wait", keywords, &original, &waiters))
        return NULL;
    if (!PyCallable_Check(original)) {
        PyErr_SetString(PyExc_TypeError, "Wait: original must be callable");
        return NULL;
    }
    Wait *self = (Wait *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = wait_vectorcall;
    self->original = new_ref(original);
    self->append = PyObject_GetAttrString(waiters, "append");
    self->pop = self->append == NULL ? NULL : PyObject_GetAttrString(waiters, "pop");
    if (self->pop == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *
wait_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return new_ref(self);
    return PyMethod_New(self, obj);
}

static int
wait_traverse(Wait *self, visitproc visit, void *arg)
{
    Py_VISIT(self->original);
    Py_VISIT(self->append);
    Py_VISIT(self->pop);
    Py_VISIT(self->dict);
    return 0;
}

static int
wait_clear(Wait *self)
{
    Py_CLEAR(self->original);
    Py_CLEAR(self->append);
    Py_CLEAR(self->pop);
    Py_CLEAR(self->dict);
    return 0;
}

static void
wait_dealloc(Wait *self)
{
    PyObject_GC_UnTrack(self);
    wait_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject WaitType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mycroft.instrumentation._hotpath.Wait",
    .tp_basicsize = sizeof(Wait),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(Wait, vectorcall),
    .tp_dictoffset = offsetof(Wait, dict),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = wait_get,
    .tp_new = wait_new,
    .tp_traverse = (traverseproc)wait_traverse,
    .tp_clear = (inquiry)wait_clear,
    .tp_dealloc = (destructor)wait_dealloc,
    .tp_doc = "Work.wait, counting the threads inside it: Wait(original, waiters).",
};

static PyMethodDef module_methods[] = {
    {"door", make_door, METH_VARARGS,
     "door(original, name, module, doc=None): the builtin function torch.distributed gets, bound to a Door"},
    {"configure", configure, METH_VARARGS,
     "configure(op_record_type, group_info_type, depth_type, payload_info, state_completed, state_in_flight): once"},
    {NULL, NULL, 0, NULL},
};

/* Multi-phase initialisation, for its slots: the module keeps its state in C statics (the configured types,
 * the payload getters, the per-thread depth), so it is one per process -- not for subinterpreters -- and it
 * relies on the GIL (see docs/instrumentation.md, "Free-threaded CPython"): on a free-threaded 3.13 build,
 * importing it turns the GIL on, as CPython does for any module that does not declare otherwise. */
static int
module_exec(PyObject *module)
{
    static int at_fork_registered;
    if (PyType_Ready(&HotType) < 0 || PyType_Ready(&WaitType) < 0 || PyType_Ready(&CountersType) < 0 ||
        PyType_Ready(&DoorType) < 0 || PyType_Ready(&RingType) < 0)
        return -1;
    if (PyModule_AddType(module, &HotType) < 0 || PyModule_AddType(module, &WaitType) < 0 ||
        PyModule_AddType(module, &CountersType) < 0 || PyModule_AddType(module, &RingType) < 0)
        return -1;
    if (!at_fork_registered) {
        int failed = pthread_atfork(NULL, NULL, after_fork_in_child);
        if (failed != 0) {
            errno = failed;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        at_fork_registered = 1;
    }
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
#ifdef Py_mod_gil
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_hotpath", "The training thread's hot path for a sync collective (see the C file).", 0,
    module_methods, module_slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    return PyModuleDef_Init(&module_def);
}
