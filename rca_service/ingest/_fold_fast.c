/* The RCA's compiled heartbeat fold: state._apply_heartbeat for the common heartbeat.
 *
 * At 16k ranks the live path folds 16k heartbeats a second; in Python each costs ~12-30 us of
 * bytecode (a few dozen attribute reads and writes, three small loops), a third of the
 * service's CPU. This does the same in C for the heartbeat a running rank sends every beat:
 * its group table is the one it last sent (the decoder hands it over as the same objects, so
 * the table was admitted and looked up before), and every value has its common type. Anything
 * else -- a first or changed table, a final heartbeat, an unusual type -- returns 0 before
 * touching any state, and the Python fold (the definition) does the whole heartbeat.
 * tests/rca/test_fold_fast.py folds the same heartbeats both ways and compares the states.
 *
 * fold(job, rank, attributes, received_at, end_ns, max_stack_chars, max_seqs_per_group) ->
 *   0: not folded (nothing changed), 1: folded, 2: folded but for its digests (the caller
 *   folds them: rare, one block per 16 seqs).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

enum {
    K_COUNTER, K_INTERVAL, K_FINAL, K_IDLE, K_STACK, K_COMM, K_DONE, K_STEP, K_DROPPED, K_ISSUED, K_COMPLETED,
    K_IDS, K_NAMES, K_MEMBERS, K_INFLIGHT_GIDS, K_SEQS, K_OPS, K_AGES, K_PEERS, K_SIZES, K_DTYPES, K_RETURNED,
    K_DIGEST_GIDS,
    K_SPANS_KEPT, K_SPANS_ANOMALIES, K_SPANS_SAMPLED_OUT, /* the trace budget's counts, in this order */
    K_THREAD_STACKS,                                      /* the other threads' stacks, beside the stack */
    N_KEYS
};

/* set up by configure(): the schema's attribute keys (schema.py owns them), the flow keys, the
 * send op's name and the types the fold makes */
static PyObject *keys[N_KEYS];
static PyObject *flow_keys;   /* tuple of str */
static PyObject *op_send;     /* str */
static PyObject *run_keys[9]; /* span kind key, the heartbeat kind, rank key, job id key, admission.HEARTBEAT_CHECKED */
static PyObject *inflight_type;
static PyObject *seq_record_type;
static Py_ssize_t inflight_slots[8]; /* InFlight's slot offsets in field order; [0] == 0: call the type */
static int configured;

/* attribute names of the state dataclasses (code, not schema keys) */
enum {
    A_HEARTBEATS, A_HB_COUNTER, A_LAST_HB_AT, A_HB_INTERVAL, A_FINAL, A_IDLE_S, A_IDLE_OBSERVED_AT, A_STACK,
    A_WORK, A_STEP, A_DROPPED, A_ISSUED, A_COMPLETED, A_LAST_PROGRESS_AT, A_COMPLETIONS, A_INFLIGHT, A_HB_TABLE,
    A_HB_ADMITTED, A_RANK, A_GROUPS, A_P2P_ISSUED, A_P2P_COMPLETED, A_SEQS, A_SIGS, A_VERSION, A_FLOWS,
    A_FLOW_HISTORY, A_APPEND, A_ATTRIBUTES, A_RESOURCE, A_END_NS, A_RANKS, A_LAST_SEEN, A_WORLD_SIZE, A_HB_CHECKED,
    A_SPANS_KEPT, A_SPANS_ANOMALIES, A_SPANS_SAMPLED_OUT, A_THREAD_STACKS,
    N_ATTRS
};
static const char *const ATTR_NAMES[N_ATTRS] = {
    "heartbeats", "hb_counter", "last_hb_at", "hb_interval", "final", "idle_s", "idle_observed_at", "stack",
    "work", "step", "dropped", "issued", "completed", "last_progress_at", "completions", "inflight", "hb_table",
    "hb_admitted", "rank", "groups", "p2p_issued", "p2p_completed", "seqs", "sigs", "version", "flows",
    "flow_history", "append", "attributes", "resource", "end_ns", "ranks", "last_seen", "world_size", "hb_checked",
    "spans_kept", "spans_anomalies", "spans_sampled_out", "thread_stacks",
};
static PyObject *names[N_ATTRS];
static PyObject *zero, *one, *minus_one, *empty_str;

static const char *const INFLIGHT_FIELDS[8] = {"group_id", "seq", "op", "age_s", "peer", "bytes", "observed_at",
                                                "returned"};

/* ------------------------------------------------------------------------ small helpers */
static PyObject *get(PyObject *attrs, int key) { /* borrowed, NULL when absent (no error) */
    return PyDict_GetItemWithError(attrs, keys[key]);
}

/* exact list or absent (empty); anything else: the Python fold */
static int list_or_absent(PyObject *value, PyObject **out) {
    if (value == NULL) {
        *out = NULL;
        return 1;
    }
    if (!PyList_CheckExact(value)) return 0;
    *out = value;
    return 1;
}

static Py_ssize_t len_of(PyObject *list) { return list == NULL ? 0 : PyList_GET_SIZE(list); }

/* every item of `list` at the indices the fold reads is of `type` (exactly) */
static int items_are(PyObject *list, PyTypeObject *type) {
    if (list == NULL) return 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++)
        if (Py_TYPE(PyList_GET_ITEM(list, i)) != type) return 0;
    return 1;
}

static int set_attr(PyObject *obj, int name, PyObject *value) { return PyObject_SetAttr(obj, names[name], value); }

/* obj.name += 1 */
static int increment(PyObject *obj, int name) {
    PyObject *v = PyObject_GetAttr(obj, names[name]);
    if (v == NULL) return -1;
    PyObject *w = PyNumber_Add(v, one);
    Py_DECREF(v);
    if (w == NULL) return -1;
    int r = set_attr(obj, name, w);
    Py_DECREF(w);
    return r;
}

/* value > d.get(key, 0) ; -1 on error */
static int above(PyObject *d, PyObject *key, PyObject *value) {
    PyObject *current = PyDict_GetItemWithError(d, key);
    if (current == NULL) {
        if (PyErr_Occurred()) return -1;
        current = zero;
    }
    return PyObject_RichCompareBool(value, current, Py_GT);
}

/* d[key] = max(d.get(key, 0), value): Python's max keeps the first of equals */
static int keep_max(PyObject *d, PyObject *key, PyObject *value) {
    int gt = above(d, key, value);
    if (gt <= 0) {
        if (gt < 0) return -1;
        PyObject *current = PyDict_GetItemWithError(d, key);
        if (current != NULL) return 0; /* stays */
        if (PyErr_Occurred()) return -1;
        return PyDict_SetItem(d, key, zero);
    }
    return PyDict_SetItem(d, key, value);
}

static PyObject *new_inflight(PyObject *gid, PyObject *seq, PyObject *op, PyObject *age, PyObject *peer,
                              PyObject *size, PyObject *observed_at, PyObject *returned) {
    PyObject *args[8] = {gid, seq, op, age, peer, size, observed_at, returned};
    if (!inflight_slots[0]) return PyObject_Vectorcall(inflight_type, args, 8, NULL);
    PyTypeObject *type = (PyTypeObject *)inflight_type;
    PyObject *obj = type->tp_alloc(type, 0);
    if (obj == NULL) return NULL;
    for (int i = 0; i < 8; i++) { /* a new object's slots are NULL */
        Py_INCREF(args[i]);
        *(PyObject **)((char *)obj + inflight_slots[i]) = args[i];
    }
    return obj;
}

/* state._seq_record: the group's record of `seq`, made (and the oldest dropped past the cap) if new */
static PyObject *seq_record(PyObject *group, PyObject *seq, Py_ssize_t max_seqs) {
    PyObject *seqs = PyObject_GetAttr(group, names[A_SEQS]);
    if (seqs == NULL) return NULL;
    if (!PyDict_Check(seqs)) {
        Py_DECREF(seqs);
        PyErr_SetString(PyExc_TypeError, "GroupState.seqs is not a dict");
        return NULL;
    }
    PyObject *rec = PyDict_GetItemWithError(seqs, seq);
    if (rec != NULL) {
        Py_INCREF(rec);
        Py_DECREF(seqs);
        return rec;
    }
    if (PyErr_Occurred() || (rec = PyObject_CallNoArgs(seq_record_type)) == NULL) {
        Py_DECREF(seqs);
        return NULL;
    }
    if (PyDict_SetItem(seqs, seq, rec) < 0) goto fail;
    if (PyDict_GET_SIZE(seqs) > max_seqs) {
        PyObject *key, *value, *oldest = NULL;
        Py_ssize_t pos = 0;
        while (PyDict_Next(seqs, &pos, &key, &value)) {
            int lt = oldest == NULL ? 1 : PyObject_RichCompareBool(key, oldest, Py_LT);
            if (lt < 0) goto fail;
            if (lt) oldest = key;
        }
        Py_INCREF(oldest);
        int r = PyDict_DelItem(seqs, oldest);
        Py_DECREF(oldest);
        if (r < 0) goto fail;
    }
    Py_DECREF(seqs);
    return rec;
fail:
    Py_DECREF(seqs);
    Py_DECREF(rec);
    return NULL;
}

/* ------------------------------------------------------------------------ the in-flight ops */
typedef struct {
    PyObject *gids, *seqs, *ops, *ages, *peers, *sizes, *dtypes, *returned; /* exact lists or NULL */
} InflightArrays;

static int inflight_checked(PyObject *attrs, InflightArrays *f) {
    if (!list_or_absent(get(attrs, K_SEQS), &f->seqs) || !list_or_absent(get(attrs, K_OPS), &f->ops) ||
        !list_or_absent(get(attrs, K_AGES), &f->ages) || !list_or_absent(get(attrs, K_PEERS), &f->peers) ||
        !list_or_absent(get(attrs, K_SIZES), &f->sizes) || !list_or_absent(get(attrs, K_DTYPES), &f->dtypes) ||
        !list_or_absent(get(attrs, K_RETURNED), &f->returned))
        return 0;
    return items_are(f->gids, &PyUnicode_Type) && items_are(f->seqs, &PyLong_Type) &&
           items_are(f->ops, &PyUnicode_Type) && items_are(f->ages, &PyFloat_Type) &&
           items_are(f->peers, &PyLong_Type) && items_are(f->sizes, &PyLong_Type) &&
           items_are(f->dtypes, &PyUnicode_Type) && items_are(f->returned, &PyBool_Type);
}

static PyObject *item_or(PyObject *list, Py_ssize_t i, PyObject *fallback) {
    return i < len_of(list) ? PyList_GET_ITEM(list, i) : fallback;
}

/* state._p2p_key */
static PyObject *p2p_key(PyObject *gid, PyObject *me, PyObject *peer, PyObject *op) {
    int send = PyUnicode_Compare(op, op_send) == 0;
    if (PyErr_Occurred()) return NULL;
    return send ? PyTuple_Pack(3, gid, me, peer) : PyTuple_Pack(3, gid, peer, me);
}

/* state._inflight, on checked arrays: the new in-flight list (a new reference) */
static PyObject *fold_inflight(PyObject *job, PyObject *rank, InflightArrays *f, PyObject *received_at,
                               Py_ssize_t max_seqs) {
    PyObject *inflight = PyList_New(0), *groups = NULL, *issued = NULL, *completed = NULL, *me = NULL;
    PyObject *p2p_issued = NULL, *p2p_completed = NULL, *age0 = NULL, *minus = minus_one;
    if (inflight == NULL) return NULL;
    if ((groups = PyObject_GetAttr(job, names[A_GROUPS])) == NULL ||
        (issued = PyObject_GetAttr(rank, names[A_ISSUED])) == NULL ||
        (completed = PyObject_GetAttr(rank, names[A_COMPLETED])) == NULL ||
        (me = PyObject_GetAttr(rank, names[A_RANK])) == NULL ||
        (p2p_issued = PyObject_GetAttr(rank, names[A_P2P_ISSUED])) == NULL ||
        (p2p_completed = PyObject_GetAttr(rank, names[A_P2P_COMPLETED])) == NULL ||
        (age0 = PyFloat_FromDouble(0.0)) == NULL)
        goto fail;
    if (!PyDict_Check(groups) || !PyDict_Check(issued) || !PyDict_Check(completed) || !PyDict_Check(p2p_issued) ||
        !PyDict_Check(p2p_completed)) {
        PyErr_SetString(PyExc_TypeError, "a state table is not a dict");
        goto fail;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(f->gids); i++) {
        PyObject *gid = PyList_GET_ITEM(f->gids, i);
        PyObject *seq = item_or(f->seqs, i, zero), *name = item_or(f->ops, i, empty_str);
        PyObject *age = item_or(f->ages, i, age0), *peer = item_or(f->peers, i, minus);
        PyObject *size = item_or(f->sizes, i, zero);
        int p2p = PyObject_RichCompareBool(peer, zero, Py_GE);
        if (p2p < 0) goto fail;
        PyObject *key = NULL;
        int done;
        if (p2p) {
            if ((key = p2p_key(gid, me, peer, name)) == NULL) goto fail;
            done = !above(p2p_completed, key, seq) ? 1 : 0; /* completed.get(key, 0) >= seq */
        } else {
            done = !above(completed, gid, seq) ? 1 : 0;
        }
        if (PyErr_Occurred()) {
            Py_XDECREF(key);
            goto fail;
        }
        if (!done) {
            PyObject *returned = item_or(f->returned, i, Py_False) == Py_True ? Py_True : Py_False;
            PyObject *op = new_inflight(gid, seq, name, age, peer, size, received_at, returned);
            if (op == NULL || PyList_Append(inflight, op) < 0) {
                Py_XDECREF(op);
                Py_XDECREF(key);
                goto fail;
            }
            Py_DECREF(op);
        }
        if (p2p) {
            int r = keep_max(p2p_issued, key, seq);
            Py_DECREF(key);
            if (r < 0) goto fail;
            continue;
        }
        int gt = above(issued, gid, seq); /* state._advance */
        if (gt < 0 || (gt && PyDict_SetItem(issued, gid, seq) < 0)) goto fail;
        PyObject *group = PyDict_GetItemWithError(groups, gid);
        if (group == NULL) {
            if (PyErr_Occurred()) goto fail;
            continue;
        }
        PyObject *rec = seq_record(group, seq, max_seqs);
        if (rec == NULL) goto fail;
        PyObject *sigs = PyObject_GetAttr(rec, names[A_SIGS]);
        int known = sigs == NULL ? -1 : PyDict_Check(sigs) ? PyDict_Contains(sigs, me) : -1;
        if (known == 0) {
            PyObject *sig = PyTuple_Pack(3, name, size, item_or(f->dtypes, i, empty_str));
            int r = sig == NULL ? -1 : PyDict_SetItem(sigs, me, sig);
            Py_XDECREF(sig);
            if (r < 0 || increment(rec, A_VERSION) < 0 || increment(group, A_VERSION) < 0) known = -1;
        } else if (known < 0 && sigs != NULL && !PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "SeqRecord.sigs is not a dict");
        }
        Py_XDECREF(sigs);
        Py_DECREF(rec);
        if (known < 0) goto fail;
    }
    Py_DECREF(groups);
    Py_DECREF(issued);
    Py_DECREF(completed);
    Py_DECREF(me);
    Py_DECREF(p2p_issued);
    Py_DECREF(p2p_completed);
    Py_DECREF(age0);
    return inflight;
fail:
    Py_DECREF(inflight);
    Py_XDECREF(groups);
    Py_XDECREF(issued);
    Py_XDECREF(completed);
    Py_XDECREF(me);
    Py_XDECREF(p2p_issued);
    Py_XDECREF(p2p_completed);
    Py_XDECREF(age0);
    return NULL;
}

/* ------------------------------------------------------------------------ the heartbeat */
typedef struct {
    PyObject *counter, *interval, *idle, *stack, *threads, *comm, *done, *step, *dropped, *issued, *completed;
    PyObject *spans[3]; /* K_SPANS_KEPT .. K_SPANS_SAMPLED_OUT */
    PyObject *admitted; /* rank.hb_admitted (a new reference) */
    InflightArrays inflight;
    int has_digests;
} Checked;

/* 1: the heartbeat is the common one, its values in `c`; 0: the Python fold's; -1: error */
static int check(PyObject *rank, PyObject *attrs, Checked *c) {
    memset(c, 0, sizeof *c);
    c->counter = get(attrs, K_COUNTER);
    if (c->counter != NULL && !PyLong_CheckExact(c->counter)) return 0;
    c->interval = get(attrs, K_INTERVAL);
    if (c->interval != NULL && !PyFloat_CheckExact(c->interval)) return 0;
    if (get(attrs, K_FINAL) != NULL) return 0; /* a final heartbeat (or a "not final" one): rare */
    c->idle = get(attrs, K_IDLE);
    if (c->idle != NULL && !PyFloat_CheckExact(c->idle)) return 0;
    c->stack = get(attrs, K_STACK);
    if (c->stack != NULL && !PyUnicode_CheckExact(c->stack)) return 0;
    c->threads = get(attrs, K_THREAD_STACKS);
    if (c->threads != NULL && !PyUnicode_CheckExact(c->threads)) return 0;
    c->comm = get(attrs, K_COMM);
    if (c->comm != NULL && !PyFloat_CheckExact(c->comm)) return 0;
    c->done = get(attrs, K_DONE);
    if (c->done != NULL && !PyLong_CheckExact(c->done)) return 0;
    c->step = get(attrs, K_STEP);
    if (c->step != NULL && !PyLong_CheckExact(c->step)) return 0;
    c->dropped = get(attrs, K_DROPPED);
    if (c->dropped != NULL && !PyLong_CheckExact(c->dropped)) return 0;
    for (int i = 0; i < 3; i++) {
        c->spans[i] = get(attrs, K_SPANS_KEPT + i);
        if (c->spans[i] != NULL && !PyLong_CheckExact(c->spans[i])) return 0;
    }
    if (!list_or_absent(get(attrs, K_ISSUED), &c->issued) || !list_or_absent(get(attrs, K_COMPLETED), &c->completed))
        return 0;
    PyObject *gids = get(attrs, K_INFLIGHT_GIDS);
    if (gids != NULL && !PyList_CheckExact(gids)) return 0;
    c->inflight.gids = gids != NULL && PyList_GET_SIZE(gids) ? gids : NULL;
    if (c->inflight.gids != NULL && !inflight_checked(attrs, &c->inflight)) return 0;
    PyObject *digests = get(attrs, K_DIGEST_GIDS);
    if (digests != NULL) {
        if (!PyList_CheckExact(digests)) return 0;
        c->has_digests = PyList_GET_SIZE(digests) > 0;
    }
    if (PyErr_Occurred()) return -1;

    /* the rank: not final, and the group table it last sent, settled (state._group_table) */
    PyObject *final = PyObject_GetAttr(rank, names[A_FINAL]);
    if (final == NULL) return -1;
    int is_final = PyObject_IsTrue(final);
    Py_DECREF(final);
    if (is_final != 0) return is_final < 0 ? -1 : 0;
    PyObject *table = PyObject_GetAttr(rank, names[A_HB_TABLE]);
    if (table == NULL) return -1;
    int same = PyTuple_CheckExact(table) && PyTuple_GET_SIZE(table) == 3;
    if (same) {
        PyObject *ids = get(attrs, K_IDS), *group_names = get(attrs, K_NAMES), *members = get(attrs, K_MEMBERS);
        same = PyTuple_GET_ITEM(table, 0) == (ids ? ids : Py_None) &&
               PyTuple_GET_ITEM(table, 1) == (group_names ? group_names : Py_None) &&
               PyTuple_GET_ITEM(table, 2) == (members ? members : Py_None);
    }
    Py_DECREF(table);
    if (!same) return 0;
    c->admitted = PyObject_GetAttr(rank, names[A_HB_ADMITTED]);
    if (c->admitted == NULL) return -1;
    if (!PyList_CheckExact(c->admitted)) goto other;
    Py_ssize_t n_issued = len_of(c->issued), n_completed = len_of(c->completed);
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(c->admitted); j++) {
        PyObject *pair = PyList_GET_ITEM(c->admitted, j);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyLong_CheckExact(PyTuple_GET_ITEM(pair, 0)) ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(pair, 1)))
            goto other;
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
        if (i < 0) {
            PyErr_Clear();
            goto other;
        }
        if ((i < n_issued && !PyLong_CheckExact(PyList_GET_ITEM(c->issued, i))) ||
            (i < n_completed && !PyLong_CheckExact(PyList_GET_ITEM(c->completed, i))))
            goto other;
    }
    return 1;
other:
    Py_CLEAR(c->admitted);
    return 0;
}

static int fold_frontiers(PyObject *job, PyObject *rank, Checked *c, PyObject *received_at) {
    PyObject *issued = PyObject_GetAttr(rank, names[A_ISSUED]);
    PyObject *completed = issued ? PyObject_GetAttr(rank, names[A_COMPLETED]) : NULL;
    int r = -1;
    if (completed == NULL) goto out;
    if (!PyDict_Check(issued) || !PyDict_Check(completed)) {
        PyErr_SetString(PyExc_TypeError, "a frontier is not a dict");
        goto out;
    }
    Py_ssize_t n_issued = len_of(c->issued), n_completed = len_of(c->completed);
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(c->admitted); j++) {
        PyObject *pair = PyList_GET_ITEM(c->admitted, j);
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
        PyObject *gid = PyTuple_GET_ITEM(pair, 1);
        if (i < n_issued) {
            PyObject *seq = PyList_GET_ITEM(c->issued, i);
            int gt = above(issued, gid, seq);
            if (gt < 0 || (gt && PyDict_SetItem(issued, gid, seq) < 0)) goto out;
        }
        if (i < n_completed) {
            PyObject *seq = PyList_GET_ITEM(c->completed, i);
            int gt = above(completed, gid, seq);
            if (gt < 0) goto out;
            if (gt && (PyDict_SetItem(completed, gid, seq) < 0 || set_attr(job, A_LAST_PROGRESS_AT, received_at) < 0 ||
                       increment(job, A_COMPLETIONS) < 0))
                goto out;
        }
    }
    r = 0;
out:
    Py_XDECREF(issued);
    Py_XDECREF(completed);
    return r;
}

/* rank.work.append((end, comm, done)) unless the last sample is as late */
static int fold_work(PyObject *rank, Checked *c, PyObject *end_ns) {
    double end = PyLong_AsDouble(end_ns);
    if (end == -1.0 && PyErr_Occurred()) return -1;
    end /= 1e9;
    PyObject *work = PyObject_GetAttr(rank, names[A_WORK]);
    if (work == NULL) return -1;
    Py_ssize_t n = PyObject_Length(work);
    int r = -1, later = 1;
    if (n < 0) goto out;
    if (n > 0) {
        PyObject *last = PySequence_GetItem(work, n - 1);
        PyObject *last_at = last ? PySequence_GetItem(last, 0) : NULL;
        Py_XDECREF(last);
        if (last_at == NULL) goto out;
        double at = PyFloat_AsDouble(last_at);
        Py_DECREF(last_at);
        if (at == -1.0 && PyErr_Occurred()) goto out;
        later = end > at;
    }
    if (later) {
        PyObject *sample = Py_BuildValue("(dOO)", end, c->comm, c->done ? c->done : zero);
        PyObject *res = sample ? PyObject_CallMethodOneArg(work, names[A_APPEND], sample) : NULL;
        Py_XDECREF(sample);
        if (res == NULL) goto out;
        Py_DECREF(res);
    }
    r = 0;
out:
    Py_DECREF(work);
    return r;
}

/* rank.flows and rank.flow_history, as the Python fold sets them */
static int fold_flows(PyObject *rank, PyObject *attrs) {
    PyObject *flows = PyDict_New();
    if (flows == NULL) return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(flow_keys); i++) {
        PyObject *key = PyTuple_GET_ITEM(flow_keys, i);
        PyObject *value = PyDict_GetItemWithError(attrs, key);
        if (value == NULL) {
            if (PyErr_Occurred()) goto fail;
            continue;
        }
        PyObject *copy = PyList_Check(value) || PyTuple_Check(value) ? PySequence_List(value) : PyList_New(0);
        int r = copy == NULL ? -1 : PyDict_SetItem(flows, key, copy);
        Py_XDECREF(copy);
        if (r < 0) goto fail;
    }
    if (set_attr(rank, A_FLOWS, flows) < 0) goto fail;
    PyObject *history = PyObject_GetAttr(rank, names[A_FLOW_HISTORY]);
    if (history == NULL) goto fail;
    Py_ssize_t n = PyObject_Length(history);
    int r = n < 0 ? -1 : 0;
    if (r == 0 && (PyDict_GET_SIZE(flows) || n)) {
        PyObject *entry = PyList_New(2);
        if (entry == NULL) {
            r = -1;
        } else {
            PyObject *first = PyDict_GET_SIZE(flows) ? flows : Py_None;
            Py_INCREF(first);
            Py_INCREF(Py_None);
            PyList_SET_ITEM(entry, 0, first);
            PyList_SET_ITEM(entry, 1, Py_None);
            PyObject *res = PyObject_CallMethodOneArg(history, names[A_APPEND], entry);
            Py_DECREF(entry);
            r = res == NULL ? -1 : 0;
            Py_XDECREF(res);
        }
    }
    Py_DECREF(history);
    Py_DECREF(flows);
    return r;
fail:
    Py_DECREF(flows);
    return -1;
}

/* one heartbeat: -1 error, 0 not folded (nothing changed), 1 folded, 2 folded but for its digests */
static int fold_one(PyObject *job, PyObject *rank, PyObject *attrs, PyObject *received_obj, PyObject *end_ns,
                    Py_ssize_t max_stack, Py_ssize_t max_seqs) {
    if (!configured || !PyDict_CheckExact(attrs) || !PyFloat_CheckExact(received_obj) || !PyLong_CheckExact(end_ns) ||
        max_stack < 0 || max_seqs < 0) /* odd bounds: the Python fold's slicing */
        return 0;
    double received_at = PyFloat_AS_DOUBLE(received_obj);

    /* an older heartbeat delivered late: the newer snapshot stands */
    PyObject *counter = get(attrs, K_COUNTER);
    if (counter == NULL && PyErr_Occurred()) return -1;
    if (counter != NULL && !PyLong_CheckExact(counter)) return 0;
    if (counter == NULL) counter = minus_one;
    {
        PyObject *last_counter = PyObject_GetAttr(rank, names[A_HB_COUNTER]);
        PyObject *last_at = last_counter ? PyObject_GetAttr(rank, names[A_LAST_HB_AT]) : NULL;
        int older = -1;
        if (last_at != NULL) {
            int nonneg = PyObject_RichCompareBool(counter, zero, Py_GE);
            int lt = nonneg > 0 ? PyObject_RichCompareBool(counter, last_counter, Py_LT) : nonneg;
            if (lt > 0) {
                double at = PyFloat_AsDouble(last_at);
                older = at == -1.0 && PyErr_Occurred() ? -1 : received_at <= at;
            } else {
                older = lt;
            }
        }
        Py_XDECREF(last_counter);
        Py_XDECREF(last_at);
        if (older) return older < 0 ? -1 : 1;
    }

    Checked c;
    int ok = check(rank, attrs, &c);
    if (ok <= 0) return ok;

    /* from here on the state changes: as the Python fold, in its order */
    PyObject *interval = NULL, *stack = NULL, *inflight = NULL;
    int result = -1;
    if (increment(job, A_HEARTBEATS) < 0 || set_attr(rank, A_HB_COUNTER, counter) < 0) goto out;
    {
        PyObject *last_at = PyObject_GetAttr(rank, names[A_LAST_HB_AT]);
        if (last_at == NULL) goto out;
        int later = PyObject_RichCompareBool(received_obj, last_at, Py_GT);
        Py_DECREF(last_at);
        if (later < 0 || (later && set_attr(rank, A_LAST_HB_AT, received_obj) < 0)) goto out;
    }
    if (c.interval != NULL && PyFloat_AS_DOUBLE(c.interval) != 0.0 && set_attr(rank, A_HB_INTERVAL, c.interval) < 0)
        goto out;
    if ((interval = PyObject_GetAttr(rank, names[A_HB_INTERVAL])) == NULL || set_attr(job, A_HB_INTERVAL, interval) < 0)
        goto out;
    {
        PyObject *idle = c.idle ? c.idle : PyFloat_FromDouble(0.0);
        int r = idle == NULL ? -1 : set_attr(rank, A_IDLE_S, idle);
        if (c.idle == NULL) Py_XDECREF(idle);
        if (r < 0 || set_attr(rank, A_IDLE_OBSERVED_AT, received_obj) < 0) goto out;
    }
    if (c.stack == NULL) {
        stack = empty_str;
        Py_INCREF(stack);
    } else if (PyUnicode_GET_LENGTH(c.stack) <= max_stack) {
        stack = c.stack;
        Py_INCREF(stack);
    } else {
        Py_ssize_t n = PyUnicode_GET_LENGTH(c.stack);
        stack = max_stack > 0 ? PyUnicode_Substring(c.stack, n - max_stack, n) : PyUnicode_Substring(c.stack, 0, n);
    }
    if (stack == NULL || set_attr(rank, A_STACK, stack) < 0) goto out;
    Py_DECREF(stack); /* the other threads' stacks: the first max_stack characters (the Python fold's slice) */
    stack = c.threads == NULL ? (Py_INCREF(empty_str), empty_str)
            : PyUnicode_GET_LENGTH(c.threads) <= max_stack ? (Py_INCREF(c.threads), c.threads)
            : PyUnicode_Substring(c.threads, 0, max_stack);
    if (stack == NULL || set_attr(rank, A_THREAD_STACKS, stack) < 0) goto out;
    if (c.comm != NULL && fold_work(rank, &c, end_ns) < 0) goto out;
    if (c.step != NULL && set_attr(rank, A_STEP, c.step) < 0) goto out;
    if (c.dropped != NULL && set_attr(rank, A_DROPPED, c.dropped) < 0) goto out;
    for (int i = 0; i < 3; i++)
        if (c.spans[i] != NULL && set_attr(rank, A_SPANS_KEPT + i, c.spans[i]) < 0) goto out;
    if (fold_frontiers(job, rank, &c, received_obj) < 0) goto out;
    inflight = c.inflight.gids ? fold_inflight(job, rank, &c.inflight, received_obj, max_seqs) : PyList_New(0);
    if (inflight == NULL || set_attr(rank, A_INFLIGHT, inflight) < 0) goto out;
    if (fold_flows(rank, attrs) < 0) goto out;
    result = c.has_digests ? 2 : 1;
out:
    Py_XDECREF(c.admitted);
    Py_XDECREF(interval);
    Py_XDECREF(stack);
    Py_XDECREF(inflight);
    return result;
}


static PyObject *fold(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "fold(job, rank, attributes, received_at, end_ns, max_stack_chars, max_seqs)");
        return NULL;
    }
    Py_ssize_t max_stack = PyLong_AsSsize_t(args[5]), max_seqs = PyLong_AsSsize_t(args[6]);
    if ((max_stack == -1 || max_seqs == -1) && PyErr_Occurred()) return NULL;
    int r = fold_one(args[0], args[1], args[2], args[3], args[4], max_stack, max_seqs);
    return r < 0 ? NULL : PyLong_FromLong(r);
}


/* Does `record` continue the run: a heartbeat of the same job (`facts`: its resource's, as
 * admission.resource_facts remembers them) from a process already in it, whose admission reads
 * the very values admitted last time (apply_records' shortcut)? Its rank's state, or NULL. */
static PyObject *continues(PyObject *attrs, PyObject *resource, PyObject *ranks, PyObject *facts,
                           PyObject *facts_memo) {
    if (!PyDict_CheckExact(attrs)) return NULL;
    PyObject *kind = PyDict_GetItemWithError(attrs, run_keys[0]);
    if (kind == NULL || (kind != run_keys[1] && (!PyUnicode_CheckExact(kind) || PyUnicode_Compare(kind, run_keys[1]))))
        return NULL;
    if (PyDict_GetItemWithError(attrs, run_keys[3]) != NULL) return NULL; /* a job id of its own */
    PyObject *rank_id = PyDict_GetItemWithError(attrs, run_keys[2]);
    int overflow = 0;
    if (rank_id == NULL || !PyLong_CheckExact(rank_id) || PyLong_AsLongAndOverflow(rank_id, &overflow) < 0 || overflow)
        return NULL;
    PyObject *id = PyLong_FromVoidPtr(resource);
    PyObject *known = id ? PyDict_GetItemWithError(facts_memo, id) : NULL;
    Py_XDECREF(id);
    if (known == NULL || !PyTuple_CheckExact(known) || PyTuple_GET_SIZE(known) != 2 ||
        PyTuple_GET_ITEM(known, 0) != resource || PyTuple_GET_ITEM(known, 1) != facts)
        return NULL;
    PyObject *prior = PyDict_GetItemWithError(ranks, rank_id);
    if (prior == NULL) return NULL;
    PyObject *prior_resource = PyObject_GetAttr(prior, names[A_RESOURCE]);
    Py_XDECREF(prior_resource);
    if (prior_resource != resource) return NULL;
    PyObject *checked = PyObject_GetAttr(prior, names[A_HB_CHECKED]);
    int same = checked != NULL && PyTuple_CheckExact(checked) && PyTuple_GET_SIZE(checked) == 5;
    for (int j = 0; same && j < 5; j++) {
        PyObject *value = PyDict_GetItemWithError(attrs, run_keys[4 + j]);
        same = PyTuple_GET_ITEM(checked, j) == (value ? value : Py_None);
    }
    Py_XDECREF(checked);
    return same ? prior : NULL;
}

/* if (value > obj.name) obj.name = value */
static int raise_to(PyObject *obj, int name, PyObject *value) {
    PyObject *current = PyObject_GetAttr(obj, names[name]);
    if (current == NULL) return -1;
    int gt = PyObject_RichCompareBool(value, current, Py_GT);
    Py_DECREF(current);
    return gt < 0 ? -1 : gt ? set_attr(obj, name, value) : 0;
}

static PyObject *fold_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "fold_run(records, job, facts, facts_memo, received_at, max_stack_chars, "
                                         "max_seqs, python_fold, fold_digests, cfg)");
        return NULL;
    }
    PyObject *it = args[0], *job = args[1], *facts = args[2], *facts_memo = args[3], *received_obj = args[4];
    PyObject *python_fold = args[7], *fold_digests = args[8], *cfg = args[9];
    Py_ssize_t max_stack = PyLong_AsSsize_t(args[5]), max_seqs = PyLong_AsSsize_t(args[6]);
    if ((max_stack == -1 || max_seqs == -1) && PyErr_Occurred()) return NULL;
    if (!configured || !PyIter_Check(it) || !PyDict_Check(facts_memo) || !PyTuple_CheckExact(facts) ||
        PyTuple_GET_SIZE(facts) != 3) {
        PyErr_SetString(PyExc_TypeError, "fold_run: not configured, or not an iterator, a dict and a facts tuple");
        return NULL;
    }
    PyObject *ranks = PyObject_GetAttr(job, names[A_RANKS]);
    if (ranks == NULL) return NULL;
    if (!PyDict_Check(ranks)) {
        Py_DECREF(ranks);
        PyErr_SetString(PyExc_TypeError, "JobState.ranks is not a dict");
        return NULL;
    }
    PyObject *world = PyTuple_GET_ITEM(facts, 2), *record;
    Py_ssize_t count = 0;
    while ((record = PyIter_Next(it)) != NULL) {
        PyObject *attrs = PyObject_GetAttr(record, names[A_ATTRIBUTES]);
        PyObject *resource = attrs ? PyObject_GetAttr(record, names[A_RESOURCE]) : NULL;
        PyObject *end_ns = resource ? PyObject_GetAttr(record, names[A_END_NS]) : NULL;
        PyObject *rank = end_ns ? continues(attrs, resource, ranks, facts, facts_memo) : NULL;
        if (rank == NULL) {
            Py_XDECREF(attrs);
            Py_XDECREF(resource);
            Py_XDECREF(end_ns);
            if (PyErr_Occurred()) {
                Py_DECREF(record);
                break;
            }
            Py_DECREF(ranks);
            return Py_BuildValue("(nN)", count, record); /* the caller's to fold */
        }
        Py_INCREF(rank);
        int r = raise_to(job, A_LAST_SEEN, received_obj);
        if (r == 0) r = raise_to(job, A_WORLD_SIZE, world);
        if (r == 0) r = raise_to(rank, A_LAST_SEEN, received_obj);
        if (r == 0) r = fold_one(job, rank, attrs, received_obj, end_ns, max_stack, max_seqs);
        PyObject *res = NULL;
        if (r == 0) {
            res = PyObject_CallFunctionObjArgs(python_fold, job, rank, record, received_obj, cfg, NULL);
        } else if (r == 2) {
            res = PyObject_CallFunctionObjArgs(fold_digests, job, rank, attrs, NULL);
        } else if (r == 1) {
            res = Py_NewRef(Py_None);
        }
        Py_XDECREF(res);
        Py_DECREF(rank);
        Py_DECREF(attrs);
        Py_DECREF(resource);
        Py_DECREF(end_ns);
        Py_DECREF(record);
        if (res == NULL) break;
        count++;
    }
    Py_DECREF(ranks);
    if (PyErr_Occurred()) return NULL;
    return Py_BuildValue("(nO)", count, Py_None);
}

/* InFlight's fields as object slots of a plain dataclass (else it is called) */
static void inflight_layout(void) {
    inflight_slots[0] = 0;
    PyTypeObject *type = (PyTypeObject *)inflight_type;
    int plain = PyObject_HasAttrString(inflight_type, "__dataclass_fields__") &&
                !PyObject_HasAttrString(inflight_type, "__post_init__") && type->tp_alloc == PyType_GenericAlloc;
    if (!plain) return;
    Py_ssize_t slots[8];
    for (int i = 0; i < 8; i++) {
        PyObject *descr = PyObject_GetAttrString(inflight_type, INFLIGHT_FIELDS[i]);
        if (descr == NULL) {
            PyErr_Clear();
            return;
        }
        int member = Py_IS_TYPE(descr, &PyMemberDescr_Type);
        PyMemberDef *def = member ? ((PyMemberDescrObject *)descr)->d_member : NULL;
        Py_DECREF(descr);
        if (def == NULL || def->type != T_OBJECT_EX || (def->flags & READONLY) || def->offset <= 0) return;
        slots[i] = def->offset;
    }
    memcpy(inflight_slots, slots, sizeof slots);
}

static PyObject *configure(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *key_tuple, *flows, *send, *inflight, *seq_record, *run;
    if (!PyArg_ParseTuple(args, "O!O!UOOO!", &PyTuple_Type, &key_tuple, &PyTuple_Type, &flows, &send, &inflight,
                          &seq_record, &PyTuple_Type, &run))
        return NULL;
    if (PyTuple_GET_SIZE(run) != 9) return PyErr_Format(PyExc_ValueError, "configure() wants 9 run keys");
    for (Py_ssize_t i = 0; i < 9; i++)
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(run, i))) return PyErr_Format(PyExc_TypeError, "run key %zd", i);
    if (PyTuple_GET_SIZE(key_tuple) != N_KEYS || !PyType_Check(inflight) || !PyCallable_Check(seq_record)) {
        PyErr_Format(PyExc_ValueError, "configure() wants %d keys, the InFlight type and the SeqRecord type", N_KEYS);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(key_tuple); i++)
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(key_tuple, i))) return PyErr_Format(PyExc_TypeError, "key %zd", i);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(flows); i++)
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(flows, i))) return PyErr_Format(PyExc_TypeError, "flow key %zd", i);
    for (int i = 0; i < N_KEYS; i++) {
        Py_XSETREF(keys[i], Py_NewRef(PyTuple_GET_ITEM(key_tuple, i)));
    }
    for (int i = 0; i < 9; i++) Py_XSETREF(run_keys[i], Py_NewRef(PyTuple_GET_ITEM(run, i)));
    Py_XSETREF(flow_keys, Py_NewRef(flows));
    Py_XSETREF(op_send, Py_NewRef(send));
    Py_XSETREF(inflight_type, Py_NewRef(inflight));
    Py_XSETREF(seq_record_type, Py_NewRef(seq_record));
    inflight_layout();
    configured = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fold", (PyCFunction)(void (*)(void))fold, METH_FASTCALL,
     "fold(job, rank, attributes, received_at, end_ns, max_stack_chars, max_seqs_per_group) -> 0 | 1 | 2"},
    {"fold_run", (PyCFunction)(void (*)(void))fold_run, METH_FASTCALL,
     "fold_run(records, job, facts, facts_memo, received_at, max_stack_chars, max_seqs, python_fold, fold_digests, "
     "cfg) -> (heartbeats folded, the first record it left or None)"},
    {"configure", configure, METH_VARARGS,
     "configure(keys, flow_keys, op_send, InFlight, SeqRecord, run_keys): the schema's keys in the fold's order"},
    {NULL, NULL, 0, NULL},
};

/* Multi-phase init, for the slots. Free-threaded CPython (3.13t): this module needs the GIL, and says so
 * (Py_MOD_GIL_USED: importing it there enables the GIL for the process, with a RuntimeWarning). Without
 * the GIL it would race: configure() swaps the process-global key tables fold() reads, and a fold is a
 * sequence of reads and writes on the RCA's state objects (a rank's dicts and lists, read through borrowed
 * references: PyDict_GetItem, PyList_GET_ITEM) that must not interleave with another thread's. The
 * service folds under its own lock today; the GIL is what makes each C-API step safe. Process-global
 * state: one interpreter only. */
static int module_exec(PyObject *m) {
    (void)m;
    if (empty_str != NULL) return 0; /* a second module object (re-import): the atoms are made once (last one set) */
    for (int i = 0; i < N_ATTRS; i++)
        if ((names[i] = PyUnicode_InternFromString(ATTR_NAMES[i])) == NULL) return -1;
    if ((zero = PyLong_FromLong(0)) == NULL || (one = PyLong_FromLong(1)) == NULL ||
        (minus_one = PyLong_FromLong(-1)) == NULL || (empty_str = PyUnicode_FromString("")) == NULL)
        return -1;
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

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mycroft.rca_service.ingest._fold_fast",
    "The RCA's compiled heartbeat fold (see rca_service/ingest/state.py, _apply_heartbeat).", 0, methods,
    module_slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fold_fast(void) { return PyModuleDef_Init(&module); }
