/* The RCA receivers' OTLP traces decoder, compiled: ExportTraceServiceRequest bytes -> SpanRecords.
 *
 * Why C: at 16,384 ranks x 1 heartbeat/s the Python lean decoder (mycroft/otlp.py,
 * records_from_lean) costs ~14 us per heartbeat, a quarter of a core on its own; this walks
 * the same bytes once and looks every KeyValue up in the same DecodeCache dict.
 *
 * It is an accelerator, never a second definition of the format: whatever it is not sure of
 * (a malformed or unusual encoding, a wire type it does not expect, a value shape
 * mycroft.otlp._fast_kv does not take) makes decode() return None, and the caller decodes
 * the request with the Python path, which gives the records or the exact error.
 * tests/test_otlp_fast.py checks it against records_from_lean on mutated and random input.
 *
 * Field numbers are OTLP's (opentelemetry/proto/trace/v1/trace.proto, common.proto).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define MAX_STRING_BYTES (1 << 20) /* mycroft.otlp.MAX_STRING_CHARS: shorter in bytes is shorter in chars */
#define MAX_ARRAY_ITEMS 65536      /* mycroft.otlp.MAX_ARRAY_ITEMS */

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} Cursor;

typedef struct Memo Memo;

/* What decode() was given, for the helpers. */
typedef struct {
    Memo *memo;            /* KeyValue bytes -> (key, value) */
    PyObject *volatile_keys; /* frozenset of keys never memoized */
    PyObject *miss;        /* DecodeCache._miss(raw) -> (key, value) */
    PyObject *resource_bytes; /* DecodeCache.resource_bytes(raw) -> dict */
    PyObject *record_type; /* SpanRecord */
    Memo *resources;       /* Resource bytes -> its attributes dict (DecodeCache.resource_bytes' result) */
    Py_ssize_t max_attributes;
    Py_ssize_t misses;
    Py_ssize_t slots[11];  /* SpanRecord's slot offsets, in __init__'s order; slots[0] == 0: call it */
    const char *template_name; /* spans of this name decode against their process's last one (Template) */
    Py_ssize_t template_name_len; /* -1: none do */
} Ctx;

enum { OK = 0, UNSURE = 1, ERROR = 2 }; /* UNSURE: let Python decode it; ERROR: a Python exception is set */

/* ---------------------------------------------------------------------------------------
 * Memo: decoded KeyValues by their wire bytes, looked up without making a bytes object.
 *
 * The same job as DecodeCache.values (a dict keyed by bytes) for the compiled path: at 16k
 * heartbeats/s x ~21 KeyValues, allocating and hashing a bytes object per KeyValue was most of
 * what remained of the decode. Open addressing, linear probing, power-of-two table at most half
 * full; cleared when max_entries are held (as DecodeCache clears its dict).
 * --------------------------------------------------------------------------------------- */
typedef struct {
    uint64_t hash;
    Py_ssize_t len;
    char *bytes; /* NULL: empty slot */
    PyObject *key;
    PyObject *value;
} Entry;

struct Memo {
    PyObject_HEAD
    Entry *slots;
    Py_ssize_t mask;
    Py_ssize_t used;
    Py_ssize_t max_entries;
};

static uint64_t hash_bytes(const uint8_t *p, Py_ssize_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, (size_t)n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 29);
}

static void memo_clear_slots(Memo *m) {
    for (Py_ssize_t i = 0; i <= m->mask; i++) {
        Entry *e = &m->slots[i];
        if (e->bytes != NULL) {
            PyMem_Free(e->bytes);
            Py_DECREF(e->key);
            Py_DECREF(e->value);
            e->bytes = NULL;
        }
    }
    m->used = 0;
}

static Entry *memo_find(Memo *m, const uint8_t *p, Py_ssize_t n, uint64_t h) {
    for (Py_ssize_t i = (Py_ssize_t)(h & (uint64_t)m->mask);; i = (i + 1) & m->mask) {
        Entry *e = &m->slots[i];
        if (e->bytes == NULL || (e->hash == h && e->len == n && memcmp(e->bytes, p, (size_t)n) == 0)) return e;
    }
}

static int memo_put(Memo *m, const uint8_t *p, Py_ssize_t n, uint64_t h, PyObject *key, PyObject *value) {
    if (m->used >= m->max_entries) memo_clear_slots(m);
    Entry *e = memo_find(m, p, n, h);
    if (e->bytes != NULL) return 0; /* already there */
    e->bytes = PyMem_Malloc(n ? (size_t)n : 1);
    if (e->bytes == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(e->bytes, p, (size_t)n);
    e->hash = h;
    e->len = n;
    Py_INCREF(key);
    Py_INCREF(value);
    e->key = key;
    e->value = value;
    m->used++;
    return 0;
}

static PyObject *memo_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Py_ssize_t max_entries = 1 << 17;
    static char *names[] = {"max_entries", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n", names, &max_entries)) return NULL;
    if (max_entries < 1 || max_entries > (1 << 26)) {
        PyErr_SetString(PyExc_ValueError, "max_entries must be in 1 .. 2**26");
        return NULL;
    }
    Py_ssize_t size = 16;
    while (size < 2 * max_entries) size <<= 1;
    Memo *m = (Memo *)type->tp_alloc(type, 0);
    if (m == NULL) return NULL;
    m->slots = PyMem_Calloc((size_t)size, sizeof(Entry));
    if (m->slots == NULL) {
        Py_DECREF(m);
        return PyErr_NoMemory();
    }
    m->mask = size - 1;
    m->max_entries = max_entries;
    return (PyObject *)m;
}

static void memo_dealloc(Memo *m) {
    if (m->slots != NULL) {
        memo_clear_slots(m);
        PyMem_Free(m->slots);
    }
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t memo_len(Memo *m) { return m->used; }

static PyObject *memo_clear(Memo *m, PyObject *ignored) {
    (void)ignored;
    memo_clear_slots(m);
    Py_RETURN_NONE;
}

static PyMethodDef memo_methods[] = {
    {"clear", (PyCFunction)memo_clear, METH_NOARGS, "Forget every entry."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods memo_as_sequence = {.sq_length = (lenfunc)memo_len};

static PyTypeObject MemoType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mycroft._otlp_fast.Memo",
    .tp_doc = "Memo(max_entries=131072): decoded KeyValues by their wire bytes, for decode().",
    .tp_basicsize = sizeof(Memo),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = memo_new,
    .tp_dealloc = (destructor)memo_dealloc,
    .tp_methods = memo_methods,
    .tp_as_sequence = &memo_as_sequence,
};

/* ---------------------------------------------------------------------------------------
 * Template: the KeyValues of a process's last heartbeat, as wire bytes and decoded values.
 *
 * A rank's heartbeat repeats most of its previous one (its groups, members, names, in-flight
 * signature; often its idle time and interval), attribute by attribute in the same order. At
 * 16,384 ranks the Memo's hash table (~70k entries, each a probe, a separate bytes block and a
 * value: three cache misses per KeyValue) no longer fits the cache; comparing a KeyValue with
 * the same position of the same process's last heartbeat reads one contiguous block instead.
 * Identical bytes get the identical value object (values are read-only, DecodeCache), anything
 * else goes through the Memo as before. A Template is immutable once made: each heartbeat makes
 * the next one, so a decode that lost the GIL in a Python callback never reads a changed one.
 * Held by the resource Memo as its entry's key; not GC-tracked (it holds atoms and untracked lists).
 * --------------------------------------------------------------------------------------- */
typedef struct {
    Py_ssize_t off, len; /* of the KeyValue's bytes in Template.bytes */
    PyObject *key, *value;
} TemplateAttr;

typedef struct {
    PyObject_VAR_HEAD /* ob_size: how many attributes */
    char *bytes;
    TemplateAttr attrs[1];
} Template;

static void template_dealloc(Template *t) {
    for (Py_ssize_t i = 0; i < Py_SIZE(t); i++) {
        Py_XDECREF(t->attrs[i].key);
        Py_XDECREF(t->attrs[i].value);
    }
    PyMem_Free(t->bytes);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyTypeObject TemplateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mycroft._otlp_fast.Template",
    .tp_doc = "A process's last heartbeat's KeyValues (internal to decode()).",
    .tp_basicsize = sizeof(Template) - sizeof(TemplateAttr),
    .tp_itemsize = sizeof(TemplateAttr),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)template_dealloc,
};

/* A Template for `count` KeyValues of `total` bytes; its attributes are filled in by the caller. */
static Template *template_new(Py_ssize_t count, Py_ssize_t total) {
    Template *t = PyObject_NewVar(Template, &TemplateType, count);
    if (t == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) t->attrs[i] = (TemplateAttr){0, -1, NULL, NULL};
    t->bytes = PyMem_Malloc(total ? (size_t)total : 1);
    if (t->bytes == NULL) {
        Py_SET_SIZE(t, 0);
        Py_DECREF(t);
        PyErr_NoMemory();
        return NULL;
    }
    return t;
}

/* Varints follow protobuf's rule as upb (the Python path's parser) applies it, so both decoders
 * read the same bytes the same way: a value is at most 10 bytes, taken mod 2^64 (bits past 63 in
 * the 10th byte are dropped); a tag or a length is at most 5 bytes (a tag <= 2^32 - 1, a length
 * < 2^31 - 1), however small its value. Anything longer is malformed: UNSURE, so the Python
 * path refuses it. tests/test_otlp_differential.py feeds both the same over-long encodings. */
#define VARINT_MAX_BYTES 10
#define TAG_MAX_BYTES 5
#define LENGTH_MAX_BYTES 5

static int varint_n(Cursor *c, uint64_t *out, int max_bytes) {
    uint64_t value = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (c->p >= c->end) return UNSURE;
        uint8_t byte = *c->p++;
        value |= (uint64_t)(byte & 0x7F) << (7 * i); /* i == 9: only bit 0 lands (bit 63): mod 2^64 */
        if (byte < 0x80) {
            *out = value;
            return OK;
        }
    }
    return UNSURE;
}

static int varint(Cursor *c, uint64_t *out) { return varint_n(c, out, VARINT_MAX_BYTES); }

/* The next field's number and wire type; its payload is then read by the caller. */
static int tag(Cursor *c, uint32_t *field, uint32_t *wire) {
    uint64_t t;
    if (varint_n(c, &t, TAG_MAX_BYTES) != OK || t > 0xFFFFFFFFu || (t >> 3) == 0) return UNSURE;
    *field = (uint32_t)(t >> 3);
    *wire = (uint32_t)(t & 7);
    return OK;
}

static int delimited(Cursor *c, Cursor *inner) {
    uint64_t n;
    if (varint_n(c, &n, LENGTH_MAX_BYTES) != OK || n >= 0x7FFFFFFFu || n > (uint64_t)(c->end - c->p)) return UNSURE;
    inner->p = c->p;
    inner->end = c->p + n;
    c->p += n;
    return OK;
}

static int fixed64(Cursor *c, uint64_t *out) {
    if (c->end - c->p < 8) return UNSURE;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | c->p[i];
    c->p += 8;
    *out = v;
    return OK;
}

/* Skip a field this decoder does not read (as upb skips unknown fields); groups: unsure. */
static int skip(Cursor *c, uint32_t wire) {
    uint64_t ignored;
    Cursor inner;
    switch (wire) {
    case 0: return varint(c, &ignored);
    case 1: return fixed64(c, &ignored);
    case 2: return delimited(c, &inner);
    case 5:
        if (c->end - c->p < 4) return UNSURE;
        c->p += 4;
        return OK;
    default: return UNSURE;
    }
}

/* The next occurrence of length-delimited field `want` in a message already checked whole (its
 * fields well-formed, `want` always length-delimited); 0 at the message's end. */
static int next_delimited(Cursor *c, uint32_t want, Cursor *out) {
    while (c->p < c->end) {
        uint32_t field, wire;
        tag(c, &field, &wire);
        if (field == want) {
            delimited(c, out);
            return 1;
        }
        skip(c, wire);
    }
    return 0;
}

static PyObject *utf8(Cursor s) {
    PyObject *text = PyUnicode_DecodeUTF8((const char *)s.p, s.end - s.p, NULL);
    if (text == NULL) PyErr_Clear(); /* Python's path names the bad string */
    return text;
}

/* An id's bytes as int.from_bytes(..., "big"); 0 when empty. */
static PyObject *big_int(Cursor s) {
    Py_ssize_t n = s.end - s.p;
    if (n <= 8) {
        uint64_t v = 0;
        for (Py_ssize_t i = 0; i < n; i++) v = (v << 8) | s.p[i];
        return PyLong_FromUnsignedLongLong(v);
    }
    return _PyLong_FromByteArray(s.p, (size_t)n, 0 /* big-endian */, 0 /* unsigned */);
}

/* ---------------------------------------------------------------------------------------
 * Short strings that repeat in every span (attribute keys, span names), one object each.
 *
 * A decoded key used to be a new str per attribute per span, hashed again when it went into
 * the span's dict. Direct-mapped by the bytes' hash, replaced on collision, bounded; only ever
 * touched with the GIL held (decode() never releases it).
 * --------------------------------------------------------------------------------------- */
#define SHORT_MAX 64
#define SHORT_SLOTS 256
typedef struct {
    Py_ssize_t len;
    char bytes[SHORT_MAX];
    PyObject *text; /* NULL: empty */
} ShortEntry;
static ShortEntry short_strings[SHORT_SLOTS];

static PyObject *short_str(Cursor s) {
    Py_ssize_t n = s.end - s.p;
    if (n > SHORT_MAX) return utf8(s);
    ShortEntry *e = &short_strings[hash_bytes(s.p, n) & (SHORT_SLOTS - 1)];
    if (e->text != NULL && e->len == n && memcmp(e->bytes, s.p, (size_t)n) == 0) {
        Py_INCREF(e->text);
        return e->text;
    }
    PyObject *text = utf8(s);
    if (text == NULL) return NULL;
    if (PyObject_Hash(text) == -1) { /* cannot fail for str; its hash is now cached in the object */
        Py_DECREF(text);
        return NULL;
    }
    Py_XDECREF(e->text);
    e->len = n;
    memcpy(e->bytes, s.p, (size_t)n);
    Py_INCREF(text);
    e->text = text;
    return text;
}

/* One AnyValue holding a string, int, double or bool (exactly one field), or empty (-> "").
 * Sets *out (a new reference) or returns UNSURE for every other shape. */
static int scalar(Cursor v, PyObject **out) {
    if (v.p == v.end) {
        *out = PyUnicode_FromStringAndSize("", 0);
        return *out ? OK : ERROR;
    }
    uint32_t field, wire;
    if (tag(&v, &field, &wire) != OK) return UNSURE;
    if (field == 1 && wire == 2) { /* string_value */
        Cursor s;
        if (delimited(&v, &s) != OK || v.p != v.end || s.end - s.p > MAX_STRING_BYTES) return UNSURE;
        *out = utf8(s);
        return *out ? OK : UNSURE;
    }
    if (field == 3 && wire == 0) { /* int_value: int64, two's complement */
        uint64_t x;
        if (varint(&v, &x) != OK || v.p != v.end) return UNSURE;
        *out = PyLong_FromLongLong((long long)(int64_t)x);
        return *out ? OK : ERROR;
    }
    if (field == 4 && wire == 1) { /* double_value */
        uint64_t bits;
        if (fixed64(&v, &bits) != OK || v.p != v.end) return UNSURE;
        double d;
        memcpy(&d, &bits, sizeof d);
        *out = PyFloat_FromDouble(d);
        return *out ? OK : ERROR;
    }
    if (field == 2 && wire == 0 && v.end - v.p == 1 && v.p[0] < 2) { /* bool_value, canonical */
        *out = PyBool_FromLong(v.p[0]);
        return OK;
    }
    return UNSURE;
}

/* A serialized KeyValue: key (1) then value (2), each once, value a scalar or an array of scalars. */
static int key_value(Cursor kv, PyObject **key_out, PyObject **value_out) {
    uint32_t field, wire;
    Cursor key, any;
    if (tag(&kv, &field, &wire) != OK || field != 1 || wire != 2 || delimited(&kv, &key) != OK) return UNSURE;
    if (tag(&kv, &field, &wire) != OK || field != 2 || wire != 2 || delimited(&kv, &any) != OK) return UNSURE;
    if (kv.p != kv.end) return UNSURE;
    PyObject *value = NULL;
    Cursor peek = any;
    if (any.p != any.end && *any.p == 0x2A) { /* array_value (5, length-delimited) */
        Cursor array;
        if (tag(&peek, &field, &wire) != OK || delimited(&peek, &array) != OK || peek.p != peek.end) return UNSURE;
        value = PyList_New(0);
        if (value == NULL) return ERROR;
        while (array.p < array.end) {
            Cursor item;
            if (tag(&array, &field, &wire) != OK || field != 1 || wire != 2 || delimited(&array, &item) != OK ||
                PyList_GET_SIZE(value) >= MAX_ARRAY_ITEMS) {
                Py_DECREF(value);
                return UNSURE;
            }
            PyObject *element;
            int r = scalar(item, &element);
            if (r != OK) {
                Py_DECREF(value);
                return r;
            }
            r = PyList_Append(value, element);
            Py_DECREF(element);
            if (r < 0) {
                Py_DECREF(value);
                return ERROR;
            }
        }
        PyObject_GC_UnTrack(value); /* see untrack() */
    } else {
        int r = scalar(any, &value);
        if (r != OK) return r;
    }
    PyObject *k = short_str(key);
    if (k == NULL) {
        Py_DECREF(value);
        return UNSURE;
    }
    *key_out = k;
    *value_out = value;
    return OK;
}

/* mycroft.otlp.DecodeCache._miss's memo rule: volatile keys and floats churn the table. */
static int memoizable(Ctx *ctx, PyObject *key, PyObject *value) {
    if (PyFloat_CheckExact(value)) return 0;
    if (PyList_CheckExact(value) && PyList_GET_SIZE(value) > 0 && PyFloat_CheckExact(PyList_GET_ITEM(value, 0)))
        return 0;
    int found = PySet_Contains(ctx->volatile_keys, key);
    return found == 0 ? 1 : 0; /* an error (cannot happen for str) reads as "do not memoize" */
}

/* One attribute into `attrs`: memoized by its bytes, else decoded here, else by Python.
 * *key_out, *value_out: new references to what went in. */
static int attribute(Ctx *ctx, Cursor kv, PyObject *attrs, PyObject **key_out, PyObject **value_out) {
    Py_ssize_t n = kv.end - kv.p;
    uint64_t h = hash_bytes(kv.p, n);
    Entry *hit = memo_find(ctx->memo, kv.p, n, h);
    PyObject *key = NULL, *value = NULL;
    if (hit->bytes != NULL) {
        key = hit->key;
        value = hit->value;
        Py_INCREF(key);
        Py_INCREF(value);
    } else {
        int r = key_value(kv, &key, &value);
        if (r == ERROR) return ERROR;
        if (r == UNSURE) { /* Python's rules: the full decoder, its errors (its own memo is the dict) */
            PyObject *raw = PyBytes_FromStringAndSize((const char *)kv.p, n);
            if (raw == NULL) return ERROR;
            PyObject *pair = PyObject_CallOneArg(ctx->miss, raw);
            Py_DECREF(raw);
            if (pair == NULL) return ERROR;
            if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
                Py_DECREF(pair);
                PyErr_SetString(PyExc_TypeError, "DecodeCache._miss must return (key, value)");
                return ERROR;
            }
            key = PyTuple_GET_ITEM(pair, 0);
            value = PyTuple_GET_ITEM(pair, 1);
            Py_INCREF(key);
            Py_INCREF(value);
            Py_DECREF(pair);
        } else {
            ctx->misses++;
            if (memoizable(ctx, key, value) && memo_put(ctx->memo, kv.p, n, h, key, value) < 0) {
                Py_DECREF(key);
                Py_DECREF(value);
                return ERROR;
            }
        }
    }
    if (PyDict_SetItem(attrs, key, value) < 0) {
        Py_DECREF(key);
        Py_DECREF(value);
        return ERROR;
    }
    *key_out = key;
    *value_out = value;
    return OK;
}

/* Status {2: message, 3: code (int32)}; a repeated field merges into the same values. */
static int status(Cursor c, int32_t *code, Cursor *message) {
    while (c.p < c.end) {
        uint32_t field, wire;
        if (tag(&c, &field, &wire) != OK) return UNSURE;
        if (field == 2) {
            if (wire != 2 || delimited(&c, message) != OK) return UNSURE;
        } else if (field == 3) {
            uint64_t v;
            if (wire != 0 || varint(&c, &v) != OK) return UNSURE;
            *code = (int32_t)(uint32_t)v;
        } else if (skip(&c, wire) != OK) {
            return UNSURE;
        }
    }
    return OK;
}

/* A decoded span is a tree of atoms (str, int, float, bool) in lists and dicts: it cannot be part of
 * a reference cycle, so the cyclic GC need not track it. At 16k heartbeats/s a second of queued
 * records (~100k containers) was traversed by every young collection and promoted, only to be
 * freed by reference counting moments later. Consumers treat decoded values as read-only (they
 * are shared, mycroft.otlp.DecodeCache); one that stored a container in them would only make a
 * cycle through it uncollectable. The record's dict is the span's own; the resource is shared. */
static void untrack(PyObject *record, PyObject *attrs) {
    PyObject_GC_UnTrack(attrs);
    PyObject_GC_UnTrack(record);
}

/* Whether a span of this name decodes against its process's Template. */
static int templated(Ctx *ctx, Cursor name) {
    return ctx->template_name_len >= 0 && name.end - name.p == ctx->template_name_len &&
           memcmp(name.p, ctx->template_name, (size_t)ctx->template_name_len) == 0;
}

/* One Span -> a SpanRecord appended to `out`. `tmpl`: its process's Template (a reference held by
 * the caller, *tmpl NULL: none yet), replaced by this span's where the span is templated. */
static int span(Ctx *ctx, Cursor c, PyObject *resource, PyObject *scope, PyObject *out, PyObject **tmpl) {
    static const uint8_t nothing = 0;
    Cursor empty = {&nothing, &nothing};
    Cursor trace_id = empty, span_id = empty, parent = empty, name = empty, message = empty;
    uint64_t start = 0, end = 0;
    int32_t code = 0;
    Cursor body = c;
    while (c.p < c.end) { /* first pass: everything but the attributes, and the whole span checked */
        uint32_t field, wire;
        Cursor s;
        if (tag(&c, &field, &wire) != OK) return UNSURE;
        switch (field) {
        case 1: if (wire != 2 || delimited(&c, &trace_id) != OK) return UNSURE; break;
        case 2: if (wire != 2 || delimited(&c, &span_id) != OK) return UNSURE; break;
        case 4: if (wire != 2 || delimited(&c, &parent) != OK) return UNSURE; break;
        case 5: if (wire != 2 || delimited(&c, &name) != OK) return UNSURE; break;
        case 7: if (wire != 1 || fixed64(&c, &start) != OK) return UNSURE; break;
        case 8: if (wire != 1 || fixed64(&c, &end) != OK) return UNSURE; break;
        case 9: if (wire != 2 || delimited(&c, &s) != OK) return UNSURE; break;
        case 15:
            if (wire != 2 || delimited(&c, &s) != OK || status(s, &code, &message) != OK) return UNSURE;
            break;
        default: if (skip(&c, wire) != OK) return UNSURE;
        }
    }
    Py_ssize_t count = 0, total = 0;
    Cursor kv, scan = body;
    while (count < ctx->max_attributes && next_delimited(&scan, 9, &kv)) {
        count++;
        total += kv.end - kv.p;
    }
    Template *last = NULL, *next = NULL;
    if (tmpl != NULL && templated(ctx, name)) {
        last = (Template *)*tmpl; /* alive while the caller holds it, whatever a Python callback does */
        next = template_new(count, total);
        if (next == NULL) return ERROR;
    }
#if PY_VERSION_HEX < 0x030D0000
    PyObject *attrs = _PyDict_NewPresized(count); /* no resizing while ~21 attributes go in */
#else
    PyObject *attrs = PyDict_New(); /* 3.13 keeps the presized constructor private */
    (void)count;
#endif
    if (attrs == NULL) {
        Py_XDECREF(next);
        return ERROR;
    }
    Py_ssize_t seen = 0, at = 0;
    while (seen < count && next_delimited(&body, 9, &kv)) { /* second pass: the attributes */
        Py_ssize_t n = kv.end - kv.p;
        PyObject *key, *value;
        TemplateAttr *same = last != NULL && seen < Py_SIZE(last) ? &last->attrs[seen] : NULL;
        if (same != NULL && same->len == n && memcmp(last->bytes + same->off, kv.p, (size_t)n) == 0) {
            key = same->key; /* the process's last heartbeat carried these very bytes */
            value = same->value;
            Py_INCREF(key);
            Py_INCREF(value);
            if (PyDict_SetItem(attrs, key, value) < 0) {
                Py_DECREF(key);
                Py_DECREF(value);
                key = NULL;
            }
        } else if (attribute(ctx, kv, attrs, &key, &value) != OK) {
            key = NULL;
        }
        if (key == NULL) {
            Py_DECREF(attrs);
            Py_XDECREF(next);
            return ERROR;
        }
        if (next != NULL) { /* the references go to the next Template */
            memcpy(next->bytes + at, kv.p, (size_t)n);
            next->attrs[seen] = (TemplateAttr){at, n, key, value};
            at += n;
        } else {
            Py_DECREF(key);
            Py_DECREF(value);
        }
        seen++;
    }
    if (next != NULL) {
        Py_SET_SIZE(next, seen);
        Py_XSETREF(*tmpl, (PyObject *)next);
    }
    PyObject *args[11] = {NULL};
    args[0] = trace_id.p == trace_id.end ? PyLong_FromLong(0) : big_int(trace_id);
    args[1] = span_id.p == span_id.end ? PyLong_FromLong(0) : big_int(span_id);
    args[2] = short_str(name);
    args[3] = PyLong_FromUnsignedLongLong(start);
    args[4] = PyLong_FromUnsignedLongLong(end);
    args[5] = attrs;
    Py_INCREF(resource);
    args[6] = resource;
    args[7] = parent.p == parent.end ? PyLong_FromLong(0) : big_int(parent);
    args[8] = PyLong_FromLong(code);
    args[9] = short_str(message);
    Py_INCREF(scope);
    args[10] = scope;
    int r = OK;
    for (int i = 0; i < 11; i++)
        if (args[i] == NULL) r = PyErr_Occurred() ? ERROR : UNSURE;
    if (r == OK) {
        PyObject *record;
        if (ctx->slots[0]) { /* what SpanRecord's dataclass __init__ does, without a Python frame */
            PyTypeObject *type = (PyTypeObject *)ctx->record_type;
            record = type->tp_alloc(type, 0);
            if (record != NULL)
                for (int i = 0; i < 11; i++) { /* the new object's slots are NULL: each takes its reference */
                    *(PyObject **)((char *)record + ctx->slots[i]) = args[i];
                    args[i] = NULL;
                }
        } else {
            record = PyObject_Vectorcall(ctx->record_type, args, 11, NULL);
        }
        if (record == NULL || PyList_Append(out, record) < 0) r = ERROR;
        else untrack(record, attrs);
        Py_XDECREF(record);
    }
    for (int i = 0; i < 11; i++) Py_XDECREF(args[i]);
    return r;
}

/* ScopeSpans {1: scope {1: name}, 2: spans} */
static int scope_spans(Ctx *ctx, Cursor c, PyObject *resource, PyObject *out, PyObject **tmpl) {
    static const uint8_t nothing = 0;
    Cursor name = {&nothing, &nothing};
    Cursor first = c;
    while (c.p < c.end) {
        uint32_t field, wire;
        Cursor s;
        if (tag(&c, &field, &wire) != OK) return UNSURE;
        if (field == 1) {
            if (wire != 2 || delimited(&c, &s) != OK) return UNSURE;
            while (s.p < s.end) { /* InstrumentationScope: only its name is read */
                uint32_t f, w;
                if (tag(&s, &f, &w) != OK) return UNSURE;
                if (f == 1) {
                    if (w != 2 || delimited(&s, &name) != OK) return UNSURE;
                } else if (skip(&s, w) != OK) {
                    return UNSURE;
                }
            }
        } else if (field == 2) {
            if (wire != 2 || delimited(&c, &s) != OK) return UNSURE;
        } else if (skip(&c, wire) != OK) {
            return UNSURE;
        }
    }
    PyObject *scope = utf8(name);
    if (scope == NULL) return UNSURE;
    int r = OK;
    Cursor s;
    while (r == OK && next_delimited(&first, 2, &s)) r = span(ctx, s, resource, scope, out, tmpl);
    Py_DECREF(scope);
    return r;
}

/* ResourceSpans {1: resource (bytes, memoized by DecodeCache.resource_bytes), 2: scope_spans} */
static int resource_spans(Ctx *ctx, Cursor c, PyObject *out) {
    static const uint8_t nothing = 0;
    Cursor resource = {&nothing, &nothing};
    Cursor first = c;
    while (c.p < c.end) {
        uint32_t field, wire;
        Cursor s;
        if (tag(&c, &field, &wire) != OK) return UNSURE;
        if (field == 1 || field == 2) {
            if (wire != 2 || delimited(&c, &s) != OK) return UNSURE;
            if (field == 1) resource = s; /* the last one, as the lean schema's bytes field keeps */
        } else if (skip(&c, wire) != OK) {
            return UNSURE;
        }
    }
    /* every span of a process repeats its resource: its bytes are looked up here, Python decodes
     * (and checks) a resource only the first time (DecodeCache.resource_bytes) */
    Py_ssize_t n = resource.end - resource.p;
    uint64_t h = hash_bytes(resource.p, n);
    Entry *hit = memo_find(ctx->resources, resource.p, n, h);
    PyObject *attrs, *tmpl = NULL; /* the process's heartbeat Template (the entry's key; None: none yet) */
    if (hit->bytes != NULL) {
        attrs = hit->value;
        Py_INCREF(attrs);
        if (hit->key != Py_None) {
            tmpl = hit->key;
            Py_INCREF(tmpl);
        }
    } else {
        PyObject *raw = PyBytes_FromStringAndSize((const char *)resource.p, n);
        if (raw == NULL) return ERROR;
        attrs = PyObject_CallOneArg(ctx->resource_bytes, raw);
        Py_DECREF(raw);
        if (attrs == NULL) return ERROR;
        if (memo_put(ctx->resources, resource.p, n, h, Py_None, attrs) < 0) {
            Py_DECREF(attrs);
            return ERROR;
        }
    }
    PyObject *had = tmpl;
    int r = OK;
    Cursor s;
    while (r == OK && next_delimited(&first, 2, &s)) r = scope_spans(ctx, s, attrs, out, &tmpl);
    if (tmpl != had) { /* looked up again: a Python callback may have cleared the memo meanwhile */
        Entry *e = memo_find(ctx->resources, resource.p, n, h);
        if (e->bytes != NULL) {
            Py_INCREF(tmpl);
            Py_SETREF(e->key, tmpl);
        }
    }
    Py_XDECREF(tmpl);
    Py_DECREF(attrs);
    return r;
}

/* SpanRecord's fields as slots of a plain dataclass: their offsets into ctx->slots, so that a
 * record is filled in directly; anything else (no slots, a __post_init__, a field that is not an
 * object slot) leaves slots[0] 0 and records are made by calling the type. */
static const char *const RECORD_FIELDS[11] = {"trace_id", "span_id", "name", "start_ns", "end_ns", "attributes",
                                              "resource", "parent_span_id", "status_code", "status_message",
                                              "scope"};

static void record_layout(Ctx *ctx) {
    ctx->slots[0] = 0;
    if (!PyType_Check(ctx->record_type)) return;
    PyTypeObject *type = (PyTypeObject *)ctx->record_type;
    int plain = PyObject_HasAttrString(ctx->record_type, "__dataclass_fields__") &&
                !PyObject_HasAttrString(ctx->record_type, "__post_init__") && type->tp_alloc == PyType_GenericAlloc;
    if (!plain) return;
    Py_ssize_t slots[11];
    for (int i = 0; i < 11; i++) {
        PyObject *descr = PyObject_GetAttrString(ctx->record_type, RECORD_FIELDS[i]);
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
    memcpy(ctx->slots, slots, sizeof slots);
}

/* A whole request must be well-formed before any Python call sees part of it. */
static int check_request(Cursor c) {
    while (c.p < c.end) {
        uint32_t field, wire;
        Cursor s;
        if (tag(&c, &field, &wire) != OK) return UNSURE;
        if (field == 1) {
            if (wire != 2 || delimited(&c, &s) != OK) return UNSURE;
        } else if (skip(&c, wire) != OK) {
            return UNSURE;
        }
    }
    return OK;
}

PyDoc_STRVAR(decode_doc,
             "decode(payload, memo, volatile_keys, miss, resource_bytes, record_type, max_attributes, resources,\n"
             "       template_name=None)\n"
             "-> (records, misses) | None\n\n"
             "ExportTraceServiceRequest bytes -> SpanRecords, as mycroft.otlp.records_from_lean gives them;\n"
             "None where the Python path must decide (unusual or malformed input). Spans named template_name\n"
             "decode against the same process's last one (see Template).");

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer payload;
    Ctx ctx = {0};
    (void)self;
    PyObject *template_name = Py_None;
    if (!PyArg_ParseTuple(args, "y*O!O!OOOnO!|O", &payload, &MemoType, &ctx.memo, &PyFrozenSet_Type,
                          &ctx.volatile_keys, &ctx.miss, &ctx.resource_bytes, &ctx.record_type, &ctx.max_attributes,
                          &MemoType, &ctx.resources, &template_name))
        return NULL;
    ctx.template_name_len = -1;
    if (template_name != Py_None) {
        ctx.template_name = PyUnicode_Check(template_name)
                                ? PyUnicode_AsUTF8AndSize(template_name, &ctx.template_name_len) : NULL;
        if (ctx.template_name == NULL) {
            PyBuffer_Release(&payload);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "template_name must be a str or None");
            return NULL;
        }
    }
    record_layout(&ctx);
    Cursor c = {(const uint8_t *)payload.buf, (const uint8_t *)payload.buf + payload.len};
    PyObject *out = NULL;
    int r = check_request(c);
    if (r == OK) {
        out = PyList_New(0);
        r = out == NULL ? ERROR : OK;
    }
    Cursor s;
    while (r == OK && next_delimited(&c, 1, &s)) r = resource_spans(&ctx, s, out);
    PyBuffer_Release(&payload);
    if (r != OK) {
        Py_XDECREF(out);
        if (r == ERROR) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *result = Py_BuildValue("(Nn)", out, ctx.misses);
    return result;
}

/* ---------------------------------------------------------------------------------------
 * attributes(attributes, pieces, cached, uncached, cached_ints, cache_max) -> bytes: a span's
 * attribute fields (Span.attributes, 9) for mycroft.otlp_wire.WireEncoder.span, the ranks' encoder.
 *
 * The same loop as WireEncoder.span's Python one, on the same cache: a (key, value) found in
 * `pieces` with the value's type is its cached piece; a plain int (the seq, the bytes, the
 * values that change per op) is written here, as otlp_wire._varint writes it, and cached below
 * `cached_ints` as WireEncoder._attribute does; anything else is the Python definition's:
 * `cached((key, value))` for a miss of another type or an int past int64, `uncached(...)` for an
 * unhashable value or an equal value of another type (1 and True).
 * tests/test_otlp_wire.py compares both on made-up spans.
 * --------------------------------------------------------------------------------------- */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + n) cap *= 2;
        char *grown = PyMem_Realloc(b->data, cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

static Py_ssize_t varint_put(uint8_t *out, uint64_t v) {
    Py_ssize_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

/* KeyValue{key, value: AnyValue{int_value}} as an attribute field: 0x4A len [0x0A len key] [0x12 len [0x18 varint]] */
static PyObject *int_piece(PyObject *key, long long value) {
    Py_ssize_t key_len;
    const char *key_utf8 = PyUnicode_AsUTF8AndSize(key, &key_len);
    if (key_utf8 == NULL) return NULL;
    uint8_t number[10], any[12], head[24];
    Py_ssize_t number_len = varint_put(number, (uint64_t)value); /* negatives: ten bytes, two's complement */
    any[0] = 0x18;
    memcpy(any + 1, number, number_len);
    Py_ssize_t any_len = 1 + number_len;
    uint8_t key_head[11];
    key_head[0] = 0x0A;
    Py_ssize_t key_head_len = 1 + varint_put(key_head + 1, (uint64_t)key_len);
    Py_ssize_t kv_len = key_head_len + key_len + 2 + any_len; /* any_len < 0x80: one length byte */
    head[0] = 0x4A;
    Py_ssize_t head_len = 1 + varint_put(head + 1, (uint64_t)kv_len);
    PyObject *piece = PyBytes_FromStringAndSize(NULL, head_len + kv_len);
    if (piece == NULL) return NULL;
    char *p = PyBytes_AS_STRING(piece);
    memcpy(p, head, head_len);
    p += head_len;
    memcpy(p, key_head, key_head_len);
    p += key_head_len;
    memcpy(p, key_utf8, key_len);
    p += key_len;
    *p++ = 0x12;
    *p++ = (char)any_len;
    memcpy(p, any, any_len);
    return piece;
}

/* The piece of one (key, value); a new reference, NULL with an exception set. */
static PyObject *attribute_piece(PyObject *key, PyObject *value, PyObject *pieces, PyObject *cached,
                                 PyObject *uncached, long long cached_ints, Py_ssize_t cache_max) {
    PyObject *item = PyTuple_Pack(2, key, value);
    if (item == NULL) return NULL;
    PyObject *piece = NULL;
    PyObject *slow = cached; /* a miss: encoded and cached as WireEncoder._attribute does */
    PyObject *entry = PyDict_GetItemWithError(pieces, item); /* borrowed */
    if (entry == NULL && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) goto done;
        PyErr_Clear(); /* unhashable (a list): encoded each time */
        slow = uncached;
    } else if (entry != NULL) {
        if (PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 2 &&
            PyTuple_GET_ITEM(entry, 0) == (PyObject *)Py_TYPE(value) && PyBytes_CheckExact(PyTuple_GET_ITEM(entry, 1))) {
            piece = Py_NewRef(PyTuple_GET_ITEM(entry, 1));
            goto done;
        }
        slow = uncached; /* an equal value of another type (1 and True): encoded, the cache left as it is */
    } else if (PyLong_CheckExact(value) && PyUnicode_Check(key)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (v == -1 && PyErr_Occurred()) goto done;
        if (!overflow) {
            piece = int_piece(key, v);
            if (piece != NULL && v >= -1 && v < cached_ints && PyDict_GET_SIZE(pieces) < cache_max) {
                PyObject *cached = PyTuple_Pack(2, (PyObject *)&PyLong_Type, piece);
                if (cached == NULL || PyDict_SetItem(pieces, item, cached) < 0) Py_CLEAR(piece);
                Py_XDECREF(cached);
            }
            goto done;
        }
    }
    piece = PyObject_CallOneArg(slow, item);
    if (piece != NULL && !PyBytes_Check(piece)) {
        PyErr_SetString(PyExc_TypeError, "attributes: cached() / uncached() must return bytes");
        Py_CLEAR(piece);
    }
done:
    Py_DECREF(item);
    return piece;
}

static PyObject *attributes(PyObject *self, PyObject *args) {
    PyObject *attrs, *pieces, *cached, *uncached;
    long long cached_ints;
    Py_ssize_t cache_max;
    if (!PyArg_ParseTuple(args, "O!O!OOLn:attributes", &PyDict_Type, &attrs, &PyDict_Type, &pieces, &cached,
                          &uncached, &cached_ints, &cache_max))
        return NULL;
    Buf out = {NULL, 0, 0};
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(attrs, &position, &key, &value)) {
        Py_INCREF(key);
        Py_INCREF(value); /* slow() may run Python code that changes the dict's entries */
        PyObject *piece = attribute_piece(key, value, pieces, cached, uncached, cached_ints, cache_max);
        Py_DECREF(key);
        Py_DECREF(value);
        if (piece == NULL || buf_put(&out, PyBytes_AS_STRING(piece), PyBytes_GET_SIZE(piece)) < 0) {
            Py_XDECREF(piece);
            PyMem_Free(out.data);
            return NULL;
        }
        Py_DECREF(piece);
    }
    PyObject *result = PyBytes_FromStringAndSize(out.data ? out.data : "", out.len);
    PyMem_Free(out.data);
    return result;
}

PyDoc_STRVAR(attributes_doc,
             "attributes(attributes, pieces, cached, uncached, cached_ints, cache_max) -> bytes: a span's attribute fields "
             "(mycroft.otlp_wire.WireEncoder.span).");

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, decode_doc},
    {"attributes", attributes, METH_VARARGS, attributes_doc},
    {NULL, NULL, 0, NULL},
};

/* Multi-phase init, for the slots. Free-threaded CPython (3.13t): this module needs the GIL, and says so
 * (Py_MOD_GIL_USED: importing it there enables the GIL for the process, with a RuntimeWarning). Without
 * the GIL it would race: the short-string cache (short_strings) is process-global and unsynchronized, a
 * Memo is a plain hash table that decode() and memo_put mutate, and decode() walks borrowed references
 * (PyTuple_GET_ITEM, PyList_GET_ITEM, a memo entry's key and value) that another thread could drop.
 * Static types and process-global caches: one interpreter only. */
static int module_exec(PyObject *m) {
    if (PyType_Ready(&MemoType) < 0 || PyType_Ready(&TemplateType) < 0) return -1;
    Py_INCREF(&MemoType);
    if (PyModule_AddObject(m, "Memo", (PyObject *)&MemoType) < 0) {
        Py_DECREF(&MemoType);
        return -1;
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

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mycroft._otlp_fast",
    "Compiled OTLP wire helpers: the RCA receivers' traces decoder (mycroft/otlp.py, DecodeCache.decode) and the "
    "ranks' span attribute encoder (mycroft/otlp_wire.py).", 0, methods,
    module_slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__otlp_fast(void) { return PyModuleDef_Init(&module); }
