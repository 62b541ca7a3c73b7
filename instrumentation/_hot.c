/* The training thread's per-op bookkeeping in C: recorder.Recorder.beginner's `begin` and
 * Recorder.complete, for collectives.
 *
 * Every collective a job issues through Python passes `begin` (read the group, payload, flags,
 * torch's seq counter; build the OpRecord; mark it in flight) and `complete` (stamp it, take it
 * out of flight, queue it for the runtime thread). In Python those are ~1.6 us of bytecode per
 * op, a third to a half of what tracing added to a 4 KiB gloo all_reduce; here they are a few
 * dozen C calls. The Python functions stay the definition: this file does the same steps in
 * the same order, and hands anything unusual back to Python -- a group not yet registered, a
 * payload that is not a tensor, a group without torch's counter, a record of another type --
 * where the Python code does it. Errors are the Python code's too: `begin` counts them through
 * recorder._note_error and returns None (the op runs unrecorded), `complete` raises.
 * tests/instrumentation/test_hot_c.py runs the same calls through both and compares records
 * and recorder state.
 *
 * OpRecord stays the Python class (every other reader is Python): its __slots__ are member
 * descriptors at fixed offsets, which configure() reads once; a record is allocated and its
 * 21 slots written directly (calling the class would run its __init__ frame).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

enum {
    F_API, F_ASYNC_OP, F_BYTES, F_CALL_END_NS, F_DEVICE, F_DST, F_DTYPE, F_END_NS, F_ERROR, F_GROUP, F_KEY, F_OP,
    F_PEER, F_REDUCE_OP, F_ROOT, F_SEQ, F_SOURCE, F_SRC, F_START_NS, F_STATE, F_TIMING, N_FIELDS
};
static const char *const FIELD_NAMES[N_FIELDS] = {
    "api", "async_op", "bytes", "call_end_ns", "device", "dst", "dtype", "end_ns", "error", "group", "key", "op",
    "peer", "reduce_op", "root", "seq", "source", "src", "start_ns", "state", "timing",
};

/* attribute names read or written on the recorder, the registry and GroupInfo (code, not schema keys) */
enum {
    A_BY_PG, A_DEFAULT, A_RESOLVE, A_DEREF, A_DEVICE_ASYNC, A_HAS_COUNTER, A_SEQ_OF, A_P2P_DELTA, A_ISSUED,
    A_NEXT_SEQ, A_COMPLETED, A_COMM_SINCE, A_LAST_ACTIVITY, A_OPS_DONE, A_COMM_NS, A_PUSH, A_NOTE_ERROR,
    A_GROUPS, A_INFLIGHT, A_QUEUE, A_QUEUE_SIZE, A_APPEND, N_ATTRS
};
static const char *const ATTR_NAMES[N_ATTRS] = {
    "_by_pg", "_default", "resolve", "deref", "device_async", "has_counter", "seq_of", "p2p_counter_delta", "issued",
    "next_collective_seq", "completed", "comm_since_ns", "last_activity_ns", "ops_done", "comm_ns", "_push",
    "_note_error", "groups", "inflight", "queue", "queue_size", "append",
};
static PyObject *attr[N_ATTRS];

static PyTypeObject *record_type;
static Py_ssize_t offsets[N_FIELDS];
static PyObject *state_in_flight, *state_completed, *timing_exact, *source_python, *empty_str, *p2p_ops;
static PyObject *int_zero, *int_minus_one;
static int configured;

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* time.time_ns's clock */
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline PyObject *slot(PyObject *obj, int field) { /* borrowed; NULL when unset */
    return *(PyObject **)((char *)obj + offsets[field]);
}

static inline void set_slot(PyObject *obj, int field, PyObject *value) { /* steals nothing */
    PyObject **place = (PyObject **)((char *)obj + offsets[field]);
    PyObject *old = *place;
    Py_INCREF(value);
    *place = value;
    Py_XDECREF(old);
}

static int set_long(PyObject *obj, PyObject *name, long long value) {
    PyObject *number = PyLong_FromLongLong(value);
    if (number == NULL) return -1;
    int rc = PyObject_SetAttr(obj, name, number);
    Py_DECREF(number);
    return rc;
}

/* ------------------------------------------------------------------------------------ configure */

static PyObject *configure(PyObject *module, PyObject *args) {
    PyObject *type, *in_flight, *completed, *exact, *python, *p2p;
    if (!PyArg_ParseTuple(args, "O!UUUUO!", &PyType_Type, &type, &in_flight, &completed, &exact, &python,
                          &PyFrozenSet_Type, &p2p))
        return NULL;
    PyTypeObject *tp = (PyTypeObject *)type;
    if (tp->tp_alloc != PyType_GenericAlloc || tp->tp_itemsize != 0) {
        PyErr_SetString(PyExc_TypeError, "OpRecord must be a plain class with __slots__");
        return NULL;
    }
    PyObject *slots = PyObject_GetAttrString(type, "__slots__");
    if (slots == NULL) return NULL;
    Py_ssize_t n = PySequence_Size(slots);
    Py_DECREF(slots);
    if (n != N_FIELDS) {
        PyErr_Format(PyExc_TypeError, "OpRecord has %zd slots, this build knows %d", n, (int)N_FIELDS);
        return NULL;
    }
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *descr = PyObject_GetAttrString(type, FIELD_NAMES[i]);
        if (descr == NULL) return NULL;
        int ok = Py_IS_TYPE(descr, &PyMemberDescr_Type);
        PyMemberDef *def = ok ? ((PyMemberDescrObject *)descr)->d_member : NULL;
        Py_DECREF(descr);
        if (def == NULL || def->type != T_OBJECT_EX || (def->flags & READONLY) || def->offset <= 0) {
            PyErr_Format(PyExc_TypeError, "OpRecord.%s is no writable slot", FIELD_NAMES[i]);
            return NULL;
        }
        offsets[i] = def->offset;
    }
    for (int i = 0; i < N_ATTRS; i++) {
        if (attr[i] == NULL && (attr[i] = PyUnicode_InternFromString(ATTR_NAMES[i])) == NULL) return NULL;
    }
    Py_XSETREF(record_type, (PyTypeObject *)Py_NewRef(type));
    Py_XSETREF(state_in_flight, Py_NewRef(in_flight));
    Py_XSETREF(state_completed, Py_NewRef(completed));
    Py_XSETREF(timing_exact, Py_NewRef(exact));
    Py_XSETREF(source_python, Py_NewRef(python));
    Py_XSETREF(p2p_ops, Py_NewRef(p2p));
    if (empty_str == NULL && (empty_str = PyUnicode_FromString("")) == NULL) return NULL;
    if (int_zero == NULL && (int_zero = PyLong_FromLong(0)) == NULL) return NULL;
    if (int_minus_one == NULL && (int_minus_one = PyLong_FromLong(-1)) == NULL) return NULL;
    configured = 1;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------ begin */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *recorder, *registry, *inflight;
    PyObject *api, *op, *where;       /* the record's api and op; the name errors are counted under */
    Py_ssize_t g_pos, p_pos, r_pos, a_pos;
    PyObject *g_key, *p_key, *r_key, *a_key;
    int has_payload, has_reduce_op, has_async_flag, always_async, track;
    PyObject *payload_info;           /* recorder.payload_info: (bytes, dtype) of anything */
    PyObject *root_field;             /* (record, info, args, kwargs) -> None, or None */
} Beginner;

/* args[pos] if given by position, else kwargs.get(key) (borrowed; NULL: absent) */
static inline PyObject *argument(PyObject *args, Py_ssize_t n_args, PyObject *kwargs, Py_ssize_t pos, PyObject *key) {
    if (n_args > pos) return PyTuple_GET_ITEM(args, pos);
    if (kwargs != NULL && kwargs != Py_None && PyDict_CheckExact(kwargs)) return PyDict_GetItemWithError(kwargs, key);
    return NULL;
}

/* GroupInfo of `group` (None: the default group), as the registry resolves it; new ref, Py_None if no member */
static PyObject *group_info(Beginner *self, PyObject *group) {
    PyObject *info;
    if (group == NULL || group == Py_None) {
        info = PyObject_GetAttr(self->registry, attr[A_DEFAULT]);
        if (info == NULL) return NULL;
        if (info != Py_None) return info;
        Py_DECREF(info);
        return PyObject_CallMethodOneArg(self->registry, attr[A_RESOLVE], Py_None);
    }
    PyObject *by_pg = PyObject_GetAttr(self->registry, attr[A_BY_PG]);
    if (by_pg == NULL) return NULL;
    PyObject *key = PyLong_FromVoidPtr(group); /* id(group) */
    if (key == NULL) {
        Py_DECREF(by_pg);
        return NULL;
    }
    info = PyDict_Check(by_pg) ? PyDict_GetItemWithError(by_pg, key) : NULL;
    Py_DECREF(key);
    Py_XINCREF(info);
    Py_DECREF(by_pg);
    if (info == NULL && PyErr_Occurred()) return NULL;
    if (info != NULL) {
        PyObject *deref = PyObject_GetAttr(info, attr[A_DEREF]);
        PyObject *live = deref != NULL ? PyObject_CallNoArgs(deref) : NULL;
        Py_XDECREF(deref);
        if (live == NULL) {
            Py_DECREF(info);
            return NULL;
        }
        int same = live == group;
        Py_DECREF(live);
        if (same) return info;
        Py_DECREF(info);
    }
    return PyObject_CallMethodOneArg(self->registry, attr[A_RESOLVE], group);
}

/* the seq of the collective about to be issued: GroupInfo.next_collective_seq, whose steps these are
 * while torch's counter answers (anything else: the Python method itself); new ref */
static PyObject *next_seq(PyObject *info) {
    PyObject *has_counter = PyObject_GetAttr(info, attr[A_HAS_COUNTER]);
    if (has_counter == NULL) return NULL;
    int counting = has_counter == Py_True;
    Py_DECREF(has_counter);
    if (counting) {
        PyObject *seq_of = PyObject_GetAttr(info, attr[A_SEQ_OF]);
        PyObject *deref = seq_of != NULL ? PyObject_GetAttr(info, attr[A_DEREF]) : NULL;
        PyObject *pg = deref != NULL ? PyObject_CallNoArgs(deref) : NULL;
        PyObject *raw = pg != NULL && seq_of != Py_None ? PyObject_CallOneArg(seq_of, pg) : NULL;
        PyObject *counter = raw != NULL ? PyNumber_Long(raw) : NULL;
        Py_XDECREF(raw);
        Py_XDECREF(pg);
        Py_XDECREF(deref);
        Py_XDECREF(seq_of);
        if (counter != NULL) {
            PyObject *delta = PyObject_GetAttr(info, attr[A_P2P_DELTA]);
            long long value = PyLong_AsLongLong(counter);
            long long taken = delta != NULL ? PyLong_AsLongLong(delta) : -1;
            Py_XDECREF(delta);
            Py_DECREF(counter);
            if (PyErr_Occurred()) return NULL;
            PyObject *seq = PyLong_FromLongLong(value - taken + 1);
            if (seq != NULL && PyObject_SetAttr(info, attr[A_ISSUED], seq) == 0) return seq;
            Py_XDECREF(seq);
            return NULL;
        }
        PyErr_Clear(); /* the Python method meets the same failure and handles it (no counter: its own) */
    }
    return PyObject_CallMethodNoArgs(info, attr[A_NEXT_SEQ]);
}

static PyObject *begin_body(Beginner *self, PyObject *args, PyObject *kwargs, PyObject *group) {
    if (!PyTuple_Check(args)) {
        PyErr_SetString(PyExc_TypeError, "begin: args must be a tuple");
        return NULL;
    }
    Py_ssize_t n_args = PyTuple_GET_SIZE(args);
    if (group == NULL || group == Py_None) {
        group = argument(args, n_args, kwargs, self->g_pos, self->g_key);
        if (group == NULL && PyErr_Occurred()) return NULL;
    }
    PyObject *info = group_info(self, group);
    if (info == NULL || info == Py_None) return info;

    PyObject *nbytes = NULL, *dtype = NULL, *reduce_op = Py_None, *record = NULL, *seq = NULL;
    if (self->has_payload) {
        PyObject *payload = argument(args, n_args, kwargs, self->p_pos, self->p_key);
        if (payload == NULL && PyErr_Occurred()) goto error;
        if (payload == NULL) payload = Py_None;
        nbytes = PyObject_GetAttrString(payload, "nbytes");
        dtype = nbytes != NULL ? PyObject_GetAttrString(payload, "dtype") : NULL;
        if (dtype == NULL) {
            Py_CLEAR(nbytes);
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) goto error;
            PyErr_Clear();
            PyObject *pair = PyObject_CallOneArg(self->payload_info, payload);
            if (pair == NULL) goto error;
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
                Py_DECREF(pair);
                PyErr_SetString(PyExc_TypeError, "payload_info must return a pair");
                goto error;
            }
            nbytes = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
            dtype = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
            Py_DECREF(pair);
        }
    } else {
        nbytes = Py_NewRef(int_zero);
        dtype = Py_NewRef(Py_None);
    }
    if (self->has_reduce_op) {
        reduce_op = argument(args, n_args, kwargs, self->r_pos, self->r_key);
        if (reduce_op == NULL && PyErr_Occurred()) goto error;
        if (reduce_op == NULL) reduce_op = Py_None;
    }
    int async_op = 0;
    if (self->always_async) {
        async_op = 1;
    } else if (self->has_async_flag) {
        PyObject *flag = argument(args, n_args, kwargs, self->a_pos, self->a_key);
        if (flag == NULL && PyErr_Occurred()) goto error;
        if (flag != NULL && (async_op = PyObject_IsTrue(flag)) < 0) goto error;
    }
    long long start = now_ns();
    seq = next_seq(info);
    if (seq == NULL) goto error;
    PyObject *device = PyObject_GetAttr(info, attr[A_DEVICE_ASYNC]);
    if (device == NULL) goto error;
    PyObject *start_obj = PyLong_FromLongLong(start);
    if (start_obj == NULL) {
        Py_DECREF(device);
        goto error;
    }
    record = record_type->tp_alloc(record_type, 0);
    if (record == NULL) {
        Py_DECREF(device);
        Py_DECREF(start_obj);
        goto error;
    }
    /* OpRecord.__init__'s fields, in its order */
    set_slot(record, F_API, self->api);
    set_slot(record, F_OP, self->op);
    set_slot(record, F_GROUP, info);
    set_slot(record, F_SEQ, seq);
    set_slot(record, F_START_NS, start_obj);
    set_slot(record, F_END_NS, int_zero);
    set_slot(record, F_CALL_END_NS, int_zero);
    set_slot(record, F_DEVICE, device);
    set_slot(record, F_BYTES, nbytes);
    set_slot(record, F_DTYPE, dtype);
    set_slot(record, F_PEER, int_minus_one);
    set_slot(record, F_SRC, int_minus_one);
    set_slot(record, F_DST, int_minus_one);
    set_slot(record, F_ROOT, int_minus_one);
    set_slot(record, F_REDUCE_OP, reduce_op);
    set_slot(record, F_ASYNC_OP, async_op ? Py_True : Py_False);
    set_slot(record, F_STATE, state_in_flight);
    set_slot(record, F_ERROR, empty_str);
    set_slot(record, F_TIMING, timing_exact);
    set_slot(record, F_SOURCE, source_python);
    set_slot(record, F_KEY, int_zero);
    Py_DECREF(device);
    if (self->root_field != Py_None) {
        PyObject *call_args[4] = {record, info, args, kwargs != NULL ? kwargs : Py_None};
        PyObject *done = PyObject_Vectorcall(self->root_field, call_args, 4, NULL);
        if (done == NULL) {
            Py_DECREF(start_obj);
            goto error;
        }
        Py_DECREF(done);
    }
    if (self->track) {
        if (PyDict_GET_SIZE(self->inflight) == 0 &&
            PyObject_SetAttr(self->recorder, attr[A_COMM_SINCE], start_obj) < 0) {
            Py_DECREF(start_obj);
            goto error;
        }
        if (PyDict_SetItem(self->inflight, record, record) < 0 ||
            PyObject_SetAttr(self->recorder, attr[A_LAST_ACTIVITY], start_obj) < 0) {
            Py_DECREF(start_obj);
            goto error;
        }
    }
    Py_DECREF(start_obj);
    Py_DECREF(seq);
    Py_DECREF(nbytes);
    Py_DECREF(dtype);
    Py_DECREF(info);
    return record;
error:
    Py_XDECREF(record);
    Py_XDECREF(seq);
    Py_XDECREF(nbytes);
    Py_XDECREF(dtype);
    Py_DECREF(info);
    return NULL;
}

/* begin(args, kwargs, group=None) -> OpRecord | None */
static PyObject *begin_call(PyObject *callable, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    Beginner *self = (Beginner *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 2 || nargs > 3 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "begin(args, kwargs, group=None)");
        return NULL;
    }
    PyObject *result = begin_body(self, argv[0], argv[1] == Py_None ? NULL : argv[1], nargs == 3 ? argv[2] : NULL);
    if (result != NULL) return result;
    /* as the Python begin: count the error, log it once, run the op unrecorded */
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL; /* KeyboardInterrupt and the like go on */
    PyObject *type, *exc, *traceback;
    PyErr_Fetch(&type, &exc, &traceback);
    PyErr_NormalizeException(&type, &exc, &traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    PyObject *noted = PyObject_CallMethodObjArgs(self->recorder, attr[A_NOTE_ERROR], self->where,
                                                 exc != NULL ? exc : Py_None, NULL);
    Py_XDECREF(exc);
    if (noted == NULL) return NULL;
    Py_DECREF(noted);
    Py_RETURN_NONE;
}

static PyObject *begin_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *names[] = {"recorder", "api", "op", "where", "g_pos", "g_key", "p_pos", "p_key", "has_payload",
                            "r_key", "r_pos", "a_key", "a_pos", "always_async", "track", "payload_info",
                            "root_field", NULL};
    PyObject *recorder, *api, *op, *where, *g_key, *p_key, *r_key, *a_key, *payload_info, *root_field;
    Py_ssize_t g_pos, p_pos, r_pos, a_pos;
    int has_payload, always_async, track;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_hot.configure() first");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OUUUnUnUpUnUnppOO", names, &recorder, &api, &op, &where, &g_pos,
                                     &g_key, &p_pos, &p_key, &has_payload, &r_key, &r_pos, &a_key, &a_pos,
                                     &always_async, &track, &payload_info, &root_field))
        return NULL;
    PyObject *registry = PyObject_GetAttr(recorder, attr[A_GROUPS]);
    if (registry == NULL) return NULL;
    PyObject *inflight = PyObject_GetAttr(recorder, attr[A_INFLIGHT]);
    if (inflight == NULL || !PyDict_CheckExact(inflight)) {
        Py_DECREF(registry);
        Py_XDECREF(inflight);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "recorder.inflight must be a dict");
        return NULL;
    }
    Beginner *self = (Beginner *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(registry);
        Py_DECREF(inflight);
        return NULL;
    }
    self->vectorcall = begin_call;
    self->recorder = Py_NewRef(recorder);
    self->registry = registry;
    self->inflight = inflight;
    self->api = Py_NewRef(api);
    self->op = Py_NewRef(op);
    self->where = Py_NewRef(where);
    self->g_pos = g_pos, self->p_pos = p_pos, self->r_pos = r_pos, self->a_pos = a_pos;
    self->g_key = Py_NewRef(g_key);
    self->p_key = Py_NewRef(p_key);
    self->r_key = Py_NewRef(r_key);
    self->a_key = Py_NewRef(a_key);
    self->has_payload = has_payload;
    self->has_reduce_op = PyUnicode_GET_LENGTH(r_key) > 0;
    self->has_async_flag = PyUnicode_GET_LENGTH(a_key) > 0;
    self->always_async = always_async;
    self->track = track;
    self->payload_info = Py_NewRef(payload_info);
    self->root_field = Py_NewRef(root_field);
    return (PyObject *)self;
}

static int begin_traverse(Beginner *self, visitproc visit, void *arg) {
    Py_VISIT(self->recorder);
    Py_VISIT(self->registry);
    Py_VISIT(self->inflight);
    Py_VISIT(self->payload_info);
    Py_VISIT(self->root_field);
    return 0;
}

static int begin_clear(Beginner *self) {
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->registry);
    Py_CLEAR(self->inflight);
    Py_CLEAR(self->payload_info);
    Py_CLEAR(self->root_field);
    return 0;
}

static void begin_dealloc(Beginner *self) {
    PyObject_GC_UnTrack(self);
    begin_clear(self);
    Py_CLEAR(self->api);
    Py_CLEAR(self->op);
    Py_CLEAR(self->where);
    Py_CLEAR(self->g_key);
    Py_CLEAR(self->p_key);
    Py_CLEAR(self->r_key);
    Py_CLEAR(self->a_key);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject BeginnerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mycroft.instrumentation._hot.Beginner",
    .tp_doc = "begin(args, kwargs, group=None) -> OpRecord | None: recorder.Recorder.beginner's begin, in C",
    .tp_basicsize = sizeof(Beginner),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = begin_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Beginner, vectorcall),
    .tp_traverse = (traverseproc)begin_traverse,
    .tp_clear = (inquiry)begin_clear,
    .tp_dealloc = (destructor)begin_dealloc,
};

/* ------------------------------------------------------------------------------------ complete */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *recorder, *inflight, *append, *fallback; /* fallback: Recorder.complete (the Python function) */
    Py_ssize_t queue_size;
    PyObject *queue;
} Completer;

static int add_to_attr(PyObject *obj, PyObject *name, long long amount) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) return -1;
    long long now = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (now == -1 && PyErr_Occurred()) return -1;
    return set_long(obj, name, now + amount);
}

static PyObject *complete_body(Completer *self, PyObject *record, PyObject *state, PyObject *timing) {
    PyObject *end_ns = slot(record, F_END_NS);
    if (end_ns == NULL) {
        PyErr_SetString(PyExc_AttributeError, "end_ns");
        return NULL;
    }
    int ended = PyObject_IsTrue(end_ns);
    if (ended != 0) return ended < 0 ? NULL : Py_NewRef(Py_None);
    long long end = now_ns();
    PyObject *end_obj = PyLong_FromLongLong(end);
    if (end_obj == NULL) return NULL;
    set_slot(record, F_END_NS, end_obj);
    set_slot(record, F_STATE, state);
    set_slot(record, F_TIMING, timing);
    PyObject *group = slot(record, F_GROUP), *seq = slot(record, F_SEQ), *op = slot(record, F_OP);
    if (group == NULL || seq == NULL || op == NULL) {
        Py_DECREF(end_obj);
        PyErr_SetString(PyExc_AttributeError, "a record without group, seq or op");
        return NULL;
    }
    int is_completed = state == state_completed ? 1 : PyObject_RichCompareBool(state, state_completed, Py_EQ);
    if (is_completed < 0) goto error;
    if (is_completed) {
        PyObject *completed = PyObject_GetAttr(group, attr[A_COMPLETED]);
        if (completed == NULL) goto error;
        int later = PyObject_RichCompareBool(seq, completed, Py_GT);
        Py_DECREF(completed);
        if (later < 0) goto error;
        if (later) {
            int p2p = PySet_Contains(p2p_ops, op);
            if (p2p < 0 || (!p2p && PyObject_SetAttr(group, attr[A_COMPLETED], seq) < 0)) goto error;
        }
    }
    PyObject *was = PyDict_GetItemWithError(self->inflight, record);
    if (was == NULL && PyErr_Occurred()) goto error;
    if (was != NULL) {
        if (PyDict_DelItem(self->inflight, record) < 0 || add_to_attr(self->recorder, attr[A_OPS_DONE], 1) < 0)
            goto error;
        if (PyDict_GET_SIZE(self->inflight) == 0) {
            PyObject *since = PyObject_GetAttr(self->recorder, attr[A_COMM_SINCE]);
            if (since == NULL) goto error;
            long long since_ns = PyLong_AsLongLong(since);
            Py_DECREF(since);
            if (since_ns == -1 && PyErr_Occurred()) goto error;
            if (end - since_ns > 0 && add_to_attr(self->recorder, attr[A_COMM_NS], end - since_ns) < 0) goto error;
        }
    }
    if (PyObject_SetAttr(self->recorder, attr[A_LAST_ACTIVITY], end_obj) < 0) goto error;
    Py_DECREF(end_obj);
    Py_ssize_t queued = PyObject_Size(self->queue);
    if (queued < 0) return NULL;
    if (queued < self->queue_size) return PyObject_CallOneArg(self->append, record);
    return PyObject_CallMethodOneArg(self->recorder, attr[A_PUSH], record);
error:
    Py_DECREF(end_obj);
    return NULL;
}

/* complete(record, state=COMPLETED, timing=EXACT) */
static PyObject *complete_call(PyObject *callable, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    Completer *self = (Completer *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *given[3] = {NULL, state_completed, timing_exact};
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "complete(record, state=..., timing=...)");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) given[i] = argv[i];
    Py_ssize_t n_kw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < n_kw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (PyUnicode_CompareWithASCIIString(name, "state") == 0) {
            given[1] = argv[nargs + i];
        } else if (PyUnicode_CompareWithASCIIString(name, "timing") == 0) {
            given[2] = argv[nargs + i];
        } else {
            PyErr_Format(PyExc_TypeError, "complete() got an unexpected keyword argument %R", name);
            return NULL;
        }
    }
    if (Py_TYPE(given[0]) != record_type) { /* not an OpRecord: the Python definition decides */
        PyObject *call_args[4] = {self->recorder, given[0], given[1], given[2]};
        return PyObject_Vectorcall(self->fallback, call_args, 4, NULL);
    }
    return complete_body(self, given[0], given[1], given[2]);
}

static PyObject *complete_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *names[] = {"recorder", "fallback", NULL};
    PyObject *recorder, *fallback;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_hot.configure() first");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO", names, &recorder, &fallback)) return NULL;
    PyObject *inflight = PyObject_GetAttr(recorder, attr[A_INFLIGHT]);
    PyObject *queue = inflight != NULL ? PyObject_GetAttr(recorder, attr[A_QUEUE]) : NULL;
    PyObject *append = queue != NULL ? PyObject_GetAttr(queue, attr[A_APPEND]) : NULL;
    PyObject *size = append != NULL ? PyObject_GetAttr(recorder, attr[A_QUEUE_SIZE]) : NULL;
    Py_ssize_t queue_size = size != NULL ? PyLong_AsSsize_t(size) : -1;
    Py_XDECREF(size);
    if (queue_size < 0 || !PyDict_CheckExact(inflight)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "recorder.inflight: dict, queue_size: int >= 0");
        Py_XDECREF(inflight);
        Py_XDECREF(queue);
        Py_XDECREF(append);
        return NULL;
    }
    Completer *self = (Completer *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(inflight);
        Py_DECREF(queue);
        Py_DECREF(append);
        return NULL;
    }
    self->vectorcall = complete_call;
    self->recorder = Py_NewRef(recorder);
    self->inflight = inflight;
    self->queue = queue;
    self->append = append;
    self->fallback = Py_NewRef(fallback);
    self->queue_size = queue_size;
    return (PyObject *)self;
}

static int complete_traverse(Completer *self, visitproc visit, void *arg) {
    Py_VISIT(self->recorder);
    Py_VISIT(self->inflight);
    Py_VISIT(self->queue);
    Py_VISIT(self->append);
    Py_VISIT(self->fallback);
    return 0;
}

static int complete_clear(Completer *self) {
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->inflight);
    Py_CLEAR(self->queue);
    Py_CLEAR(self->append);
    Py_CLEAR(self->fallback);
    return 0;
}

static void complete_dealloc(Completer *self) {
    PyObject_GC_UnTrack(self);
    complete_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject CompleterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mycroft.instrumentation._hot.Completer",
    .tp_doc = "complete(record, state=COMPLETED, timing=EXACT): Recorder.complete, in C",
    .tp_basicsize = sizeof(Completer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = complete_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Completer, vectorcall),
    .tp_traverse = (traverseproc)complete_traverse,
    .tp_clear = (inquiry)complete_clear,
    .tp_dealloc = (destructor)complete_dealloc,
};

/* ------------------------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(OpRecord, STATE_IN_FLIGHT, STATE_COMPLETED, TIMING_EXACT, SOURCE_PYTHON, P2P_OPS)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_hot", "The training thread's per-op bookkeeping in C (see _hot.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__hot(void) {
    if (PyType_Ready(&BeginnerType) < 0 || PyType_Ready(&CompleterType) < 0) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    if (PyModule_AddObjectRef(module, "Beginner", (PyObject *)&BeginnerType) < 0 ||
        PyModule_AddObjectRef(module, "Completer", (PyObject *)&CompleterType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
