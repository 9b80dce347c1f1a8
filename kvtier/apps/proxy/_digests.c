/* The proxy index's per-block work, compiled: a prompt's block digests, and their lookup.

    chained(digest, tokens, size) -> list[int]   the digests of tokens' whole blocks of size,
                                                 chained from digest
    DigestMap()                                  digest -> holder (a mapping: get, [], del, in,
                                                 len, values), its keys inline in one table
    DigestMap.stretches(tokens, size, root=0)    the prompt's leading blocks held in the map, as
                     -> list[(holder, int)]      stretches held alike (the same holder object)

Each digest is exactly what prefix_index._chained makes in Python (this module is optional: the
index falls back to that and a dict where it is not built): the previous digest plus 2**96 plus
hash((position, *block_tokens)), the tuple hashed as CPython hashes a tuple (its xxHash-based
tuplehash over each item's hash). A digest is kept as a 128-bit int (its blocks' count times
2**96 plus a sum of 64-bit hashes: far inside 127 bits) and made a Python int only to be
returned. stretches reads the token list in place (no copy, no tuple per block, no int per
digest) and fetches a batch of blocks' slots at once, so their cache misses overlap. A table of
2 MiB or more is mapped apart, on huge pages where the kernel has them: a lookup lands on a
random page, and with small pages nearly each one is also a TLB miss.
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <string.h>

typedef __int128 digest_t;
typedef unsigned __int128 udigest_t;

#define BLOCK_SHIFT 96 /* each block adds 2**96 (prefix_index._BLOCK) */
#define BATCH 8       /* blocks hashed before their digests are made */

/* CPython's tuple hash (Objects/tupleobject.c, 3.8 and later), 64-bit lanes */
#define XXPRIME_1 ((Py_uhash_t)11400714785074694791ULL)
#define XXPRIME_2 ((Py_uhash_t)14029467366897019727ULL)
#define XXPRIME_5 ((Py_uhash_t)2870177450012600261ULL)
#define XXROTATE(x) (((x) << 31) | ((x) >> 33))

#if SIZEOF_PY_HASH_T != 8
#error "64-bit hashes only"
#endif

static inline Py_uhash_t
tuple_step(Py_uhash_t acc, Py_uhash_t lane)
{
    acc += lane * XXPRIME_2;
    acc = XXROTATE(acc);
    return acc * XXPRIME_1;
}

/* hash(item) for a token: an int's own value when it is its hash (0 <= v < 2**61 - 1); a
   small int's value is read from the object itself (no call) */
static inline int
lane_of(PyObject *item, Py_uhash_t *lane)
{
    if (PyLong_CheckExact(item)) {
#if PY_VERSION_HEX >= 0x030C0000
        if (PyUnstable_Long_IsCompact((PyLongObject *)item)) {
            Py_ssize_t v = PyUnstable_Long_CompactValue((PyLongObject *)item);
            if (v >= 0) {
                *lane = (Py_uhash_t)v;
                return 0;
            }
        }
#else
        Py_ssize_t digits = Py_SIZE(item);
        if (digits == 0 || digits == 1) { /* 0 <= v < 2**30 */
            *lane = digits ? (Py_uhash_t)((PyLongObject *)item)->ob_digit[0] : 0;
            return 0;
        }
#endif
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (!overflow && v >= 0 && (unsigned long long)v < (unsigned long long)_PyHASH_MODULUS) {
            *lane = (Py_uhash_t)v;
            return 0;
        }
        if (!overflow && v == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
    Py_hash_t h = PyObject_Hash(item);
    if (h == -1) {
        return -1;
    }
    *lane = (Py_uhash_t)h;
    return 0;
}

/* the hash of a position as a tuple's first item */
static inline int
position_lane(long long position, Py_uhash_t *lane)
{
    if (position >= 0 && (unsigned long long)position < (unsigned long long)_PyHASH_MODULUS) {
        *lane = (Py_uhash_t)position;
        return 0;
    }
    PyObject *pos = PyLong_FromLongLong(position); /* never for a real prompt */
    if (pos == NULL) {
        return -1;
    }
    int failed = lane_of(pos, lane);
    Py_DECREF(pos);
    return failed;
}

static inline Py_hash_t
tuple_end(Py_uhash_t acc, Py_ssize_t length)
{
    acc += (Py_uhash_t)length ^ (XXPRIME_5 ^ 3527539UL);
    return acc == (Py_uhash_t)-1 ? 1546275796 : (Py_hash_t)acc;
}

#define LANES 4 /* blocks hashed at once: each block's hash is a chain of multiplies, and
                   LANES chains in step keep the multiplier busy */
#define READ_AHEAD 1024 /* tokens whose lanes are read before they are hashed (8 KB) */

/* out[k] = hash((position + k, *lanes[k * size:(k + 1) * size])) for k < count, each token's
   lane already read */
static int
hash_lanes(long long position, const Py_uhash_t *lanes, Py_ssize_t size, Py_ssize_t count,
           Py_hash_t *out)
{
    Py_ssize_t k = 0;
    Py_uhash_t lane[LANES];
    for (; k + LANES <= count; k += LANES) {
        Py_uhash_t acc[LANES];
        for (int j = 0; j < LANES; j++) {
            if (position_lane(position + k + j, &lane[j]) < 0) {
                return -1;
            }
            acc[j] = tuple_step(XXPRIME_5, lane[j]);
        }
        const Py_uhash_t *block = lanes + k * size;
        for (Py_ssize_t i = 0; i < size; i++) {
            for (int j = 0; j < LANES; j++) {
                acc[j] = tuple_step(acc[j], block[j * size + i]);
            }
        }
        for (int j = 0; j < LANES; j++) {
            out[k + j] = tuple_end(acc[j], size + 1);
        }
    }
    for (; k < count; k++) {
        if (position_lane(position + k, &lane[0]) < 0) {
            return -1;
        }
        Py_uhash_t acc = tuple_step(XXPRIME_5, lane[0]);
        for (Py_ssize_t i = 0; i < size; i++) {
            acc = tuple_step(acc, lanes[k * size + i]);
        }
        out[k] = tuple_end(acc, size + 1);
    }
    return 0;
}

/* out[k] = hash((position + k, *items[k * size:(k + 1) * size])) for k < count: the tokens'
   lanes read first, in a loop whose steps do not wait on each other (a token object's cache
   miss overlaps the next ones'), then hashed from those, READ_AHEAD tokens at a time */
static int
hash_blocks(long long position, PyObject **items, Py_ssize_t size, Py_ssize_t count,
            Py_hash_t *out)
{
    Py_uhash_t lanes[READ_AHEAD];
    Py_ssize_t step = size <= READ_AHEAD ? READ_AHEAD / size : 0; /* blocks read at once */
    for (Py_ssize_t k = 0; k < count;) {
        Py_ssize_t n = step == 0 ? 1 : count - k < step ? count - k : step;
        if (step == 0) { /* a block of more than READ_AHEAD tokens: one at a time */
            Py_uhash_t acc;
            if (position_lane(position + k, &acc) < 0) {
                return -1;
            }
            acc = tuple_step(XXPRIME_5, acc);
            for (Py_ssize_t i = 0; i < size; i++) {
                Py_uhash_t lane;
                if (lane_of(items[k * size + i], &lane) < 0) {
                    return -1;
                }
                acc = tuple_step(acc, lane);
            }
            out[k] = tuple_end(acc, size + 1);
        } else {
            PyObject **block = items + k * size;
            for (Py_ssize_t t = 0; t < n * size; t++) {
                if (lane_of(block[t], &lanes[t]) < 0) {
                    return -1;
                }
            }
            if (hash_lanes(position + k, lanes, size, n, out + k) < 0) {
                return -1;
            }
        }
        k += n;
    }
    return 0;
}

static PyObject *
digest_to_int(digest_t d)
{
    unsigned char bytes[16];
    udigest_t u = (udigest_t)d;
    for (int i = 0; i < 16; i++) {
        bytes[i] = (unsigned char)(u & 0xff);
        u >>= 8;
    }
#if PY_VERSION_HEX >= 0x030D0000
    return PyLong_FromNativeBytes(bytes, 16, Py_ASNATIVEBYTES_LITTLE_ENDIAN);
#else
    return _PyLong_FromByteArray(bytes, 16, 1, 1);
#endif
}

/* a Python int within 128 signed bits -> digest_t; -1 with an error set otherwise */
static int
int_to_digest(PyObject *value, digest_t *out)
{
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "digest must be an int, not %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    unsigned char bytes[16];
#if PY_VERSION_HEX >= 0x030D0000
    Py_ssize_t need = PyLong_AsNativeBytes(value, bytes, 16, Py_ASNATIVEBYTES_LITTLE_ENDIAN);
    if (need < 0) {
        return -1;
    }
    if (need > 16) {
        PyErr_SetString(PyExc_OverflowError, "digest beyond 128 bits");
        return -1;
    }
#else
    if (_PyLong_AsByteArray((PyLongObject *)value, bytes, 16, 1, 1) < 0) {
        return -1;
    }
#endif
    udigest_t u = 0;
    for (int i = 15; i >= 0; i--) {
        u = (u << 8) | bytes[i];
    }
    *out = (digest_t)u;
    return 0;
}

/* the arguments both functions take: tokens as a fast sequence, a block size > 0 */
static int
parse_size(PyObject *size_obj, Py_ssize_t *size)
{
    *size = PyLong_AsSsize_t(size_obj);
    if (*size == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (*size <= 0) {
        PyErr_Format(PyExc_ValueError, "size must be > 0; got %zd", *size);
        return -1;
    }
    return 0;
}

static PyObject *
chained(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "chained(digest, tokens, size)");
        return NULL;
    }
    digest_t digest;
    Py_ssize_t size;
    if (int_to_digest(args[0], &digest) < 0 || parse_size(args[2], &size) < 0) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "tokens must be a sequence");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t blocks = PySequence_Fast_GET_SIZE(seq) / size;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    long long position = (long long)((digest + ((digest_t)1 << (BLOCK_SHIFT - 1))) >> BLOCK_SHIFT);
    PyObject *out = PyList_New(blocks);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_hash_t hashes[BATCH];
    for (Py_ssize_t b = 0; b < blocks; b++) {
        Py_ssize_t at = b % BATCH;
        if (at == 0) {
            Py_ssize_t count = blocks - b < BATCH ? blocks - b : BATCH;
            if (hash_blocks(position + b, items + b * size, size, count, hashes) < 0) {
                goto fail;
            }
        }
        digest += ((digest_t)1 << BLOCK_SHIFT) + (digest_t)hashes[at];
        PyObject *value = digest_to_int(digest);
        if (value == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(out, b, value);
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}

/* ---- DigestMap: digest -> holder, an open-addressed table of 128-bit keys ----------------

   Linear probing, at most half full, deletion by shifting back (no tombstones). A slot holds its
   key inline: a lookup reads one slot (one cache line, mostly), never a key object. */

typedef struct {
    digest_t key;
    PyObject *value; /* NULL: empty */
} slot_t;

typedef struct {
    PyObject_HEAD
    slot_t *slots;
    Py_ssize_t mask; /* capacity - 1 (a power of two) */
    Py_ssize_t used;
    size_t mapped; /* the table's bytes when mapped apart on huge pages (else 0: PyMem) */
} DigestMap;

#define MIN_CAPACITY 8

static inline Py_ssize_t
home(const DigestMap *map, digest_t key)
{
    udigest_t u = (udigest_t)key;
    uint64_t mixed = ((uint64_t)u ^ (uint64_t)(u >> 64)) * 0x9E3779B97F4A7C15ULL;
    return (Py_ssize_t)(mixed >> 17) & map->mask;
}

/* the slot of key, or the empty slot where it would go */
static inline slot_t *
find(const DigestMap *map, digest_t key)
{
    Py_ssize_t at = home(map, key);
    for (;;) {
        slot_t *slot = &map->slots[at];
        if (slot->value == NULL || slot->key == key) {
            return slot;
        }
        at = (at + 1) & map->mask;
    }
}

#define HUGE_PAGE ((size_t)2 << 20)

/* a zeroed table of capacity slots; *mapped: its bytes if mapped apart (free_slots) */
static slot_t *
alloc_slots(Py_ssize_t capacity, size_t *mapped)
{
    size_t bytes = (size_t)capacity * sizeof(slot_t);
    *mapped = 0;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bytes >= HUGE_PAGE) {
        /* a large table on huge pages, aligned to one: a lookup lands on a random page, and
           with small pages nearly each is a TLB miss whose page walk waits on memory too */
        char *raw = mmap(NULL, bytes + HUGE_PAGE, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw != MAP_FAILED) {
            char *at = (char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
            if (at > raw) {
                munmap(raw, (size_t)(at - raw));
            }
            size_t tail = (size_t)(raw + bytes + HUGE_PAGE - (at + bytes));
            if (tail) {
                munmap(at + bytes, tail);
            }
            madvise(at, bytes, MADV_HUGEPAGE); /* advice: small pages if none are free */
            *mapped = bytes;
            return (slot_t *)at;
        }
    }
#endif
    return PyMem_Calloc((size_t)capacity, sizeof(slot_t));
}

static void
free_slots(slot_t *slots, size_t mapped)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (mapped) {
        munmap(slots, mapped);
        return;
    }
#endif
    PyMem_Free(slots);
}

static int
resize(DigestMap *map, Py_ssize_t capacity)
{
    slot_t *old = map->slots;
    size_t old_mapped = map->mapped;
    Py_ssize_t old_capacity = old ? map->mask + 1 : 0;
    size_t mapped;
    slot_t *slots = alloc_slots(capacity, &mapped);
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    map->slots = slots;
    map->mapped = mapped;
    map->mask = capacity - 1;
    for (Py_ssize_t i = 0; i < old_capacity; i++) {
        if (old[i].value != NULL) {
            *find(map, old[i].key) = old[i];
        }
    }
    if (old != NULL) {
        free_slots(old, old_mapped);
    }
    return 0;
}

static PyObject *
map_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) || (kwargs && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "DigestMap() takes no arguments");
        return NULL;
    }
    DigestMap *map = (DigestMap *)type->tp_alloc(type, 0);
    if (map == NULL) {
        return NULL;
    }
    if (resize(map, MIN_CAPACITY) < 0) {
        Py_DECREF(map);
        return NULL;
    }
    return (PyObject *)map;
}

static int
map_clear(DigestMap *map)
{
    if (map->slots != NULL) {
        for (Py_ssize_t i = 0; i <= map->mask; i++) {
            Py_CLEAR(map->slots[i].value);
        }
    }
    map->used = 0;
    return 0;
}

static int
map_traverse(DigestMap *map, visitproc visit, void *arg)
{
    if (map->slots != NULL) {
        for (Py_ssize_t i = 0; i <= map->mask; i++) {
            Py_VISIT(map->slots[i].value);
        }
    }
    return 0;
}

static void
map_dealloc(DigestMap *map)
{
    PyObject_GC_UnTrack(map);
    map_clear(map);
    free_slots(map->slots, map->mapped);
    Py_TYPE(map)->tp_free((PyObject *)map);
}

static Py_ssize_t
map_len(DigestMap *map)
{
    return map->used;
}

static PyObject *
map_subscript(DigestMap *map, PyObject *key_obj)
{
    digest_t key;
    if (int_to_digest(key_obj, &key) < 0) {
        return NULL;
    }
    slot_t *slot = find(map, key);
    if (slot->value == NULL) {
        PyErr_SetObject(PyExc_KeyError, key_obj);
        return NULL;
    }
    return Py_NewRef(slot->value);
}

/* remove the slot's entry, shifting back the entries after it that probed past it */
static void
remove_slot(DigestMap *map, slot_t *slot)
{
    PyObject *value = slot->value;
    Py_ssize_t hole = slot - map->slots;
    Py_ssize_t at = hole;
    for (;;) {
        at = (at + 1) & map->mask;
        slot_t *next = &map->slots[at];
        if (next->value == NULL) {
            break;
        }
        Py_ssize_t want = home(map, next->key);
        /* next may move into the hole when its home is not in (hole, at] (cyclically) */
        if (((at - want) & map->mask) >= ((at - hole) & map->mask)) {
            map->slots[hole] = *next;
            hole = at;
        }
    }
    map->slots[hole].value = NULL;
    map->used--;
    Py_DECREF(value);
}

static int
map_ass_subscript(DigestMap *map, PyObject *key_obj, PyObject *value)
{
    digest_t key;
    if (int_to_digest(key_obj, &key) < 0) {
        return -1;
    }
    slot_t *slot = find(map, key);
    if (value == NULL) { /* del map[key] */
        if (slot->value == NULL) {
            PyErr_SetObject(PyExc_KeyError, key_obj);
            return -1;
        }
        remove_slot(map, slot);
        return 0;
    }
    if (slot->value != NULL) {
        Py_SETREF(slot->value, Py_NewRef(value));
        return 0;
    }
    if (2 * (map->used + 1) > map->mask + 1) { /* keep it at most half full */
        if (resize(map, 2 * (map->mask + 1)) < 0) {
            return -1;
        }
        slot = find(map, key);
    }
    slot->key = key;
    slot->value = Py_NewRef(value);
    map->used++;
    return 0;
}

static int
map_contains(DigestMap *map, PyObject *key_obj)
{
    digest_t key;
    if (int_to_digest(key_obj, &key) < 0) {
        return -1;
    }
    return find(map, key)->value != NULL;
}

static PyObject *
map_get(DigestMap *map, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    digest_t key;
    if (int_to_digest(args[0], &key) < 0) {
        return NULL;
    }
    PyObject *value = find(map, key)->value;
    if (value == NULL) {
        value = nargs == 2 ? args[1] : Py_None;
    }
    return Py_NewRef(value);
}

static PyObject *
map_values(DigestMap *map, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(map->used);
    if (out == NULL) {
        return NULL;
    }
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i <= map->mask && n < map->used; i++) {
        if (map->slots[i].value != NULL) {
            PyList_SET_ITEM(out, n++, Py_NewRef(map->slots[i].value));
        }
    }
    return out;
}

static PyObject *
map_sizeof(DigestMap *map, PyObject *Py_UNUSED(ignored))
{
    size_t bytes = Py_TYPE(map)->tp_basicsize + (size_t)(map->mask + 1) * sizeof(slot_t);
    return PyLong_FromSize_t(bytes);
}

/* append (holder, count) to out */
static int
append_stretch(PyObject *out, PyObject *holder, Py_ssize_t count)
{
    PyObject *n = PyLong_FromSsize_t(count);
    if (n == NULL) {
        return -1;
    }
    PyObject *pair = PyTuple_Pack(2, holder, n);
    Py_DECREF(n);
    if (pair == NULL) {
        return -1;
    }
    int failed = PyList_Append(out, pair);
    Py_DECREF(pair);
    return failed;
}

/* hash the batch of blocks from block b (at most BATCH) into out, chaining *digest, and fetch
   their slots; the token objects of the batch after it are fetched meanwhile */
static PyObject *
map_stretches(DigestMap *map, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "stretches(tokens, size, root=0)");
        return NULL;
    }
    Py_ssize_t size;
    digest_t digest = 0;
    if (parse_size(args[1], &size) < 0 || (nargs == 3 && int_to_digest(args[2], &digest) < 0)) {
        return NULL;
    }
    if ((digest + ((digest_t)1 << (BLOCK_SHIFT - 1))) >> BLOCK_SHIFT != 0) {
        PyErr_SetString(PyExc_ValueError, "root must be the digest of no block");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "tokens must be a sequence");
    if (seq == NULL) {
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t blocks = PySequence_Fast_GET_SIZE(seq) / size;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    digest_t digests[BATCH];
    Py_hash_t hashes[BATCH];
    PyObject *current = NULL; /* borrowed from the map: nothing runs here that changes it */
    Py_ssize_t count = 0;
    for (Py_ssize_t b = 0; b < blocks; b += BATCH) {
        /* a batch at a time: its blocks hashed together, their slots fetched together (each
           lookup's cache miss overlaps the others'); a prompt held no further is hashed no
           further than its batch */
        Py_ssize_t n = blocks - b < BATCH ? blocks - b : BATCH;
        Py_ssize_t ahead = (b + BATCH) * size, end = (b + 2 * BATCH) * size;
        for (Py_ssize_t t = ahead; t < end && t < blocks * size; t++) {
            __builtin_prefetch(items[t]); /* the next batch's token objects, while this one's
                                             are hashed */
        }
        if (hash_blocks(b, items + b * size, size, n, hashes) < 0) {
            goto fail;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            digest += ((digest_t)1 << BLOCK_SHIFT) + (digest_t)hashes[k];
            digests[k] = digest;
            __builtin_prefetch(&map->slots[home(map, digest)]);
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *holder = find(map, digests[k])->value;
            if (holder == NULL) { /* no engine holds this block: the prompt's runs end here */
                goto done;
            }
            if (holder == current) {
                count++;
                continue;
            }
            if (current != NULL && append_stretch(out, current, count) < 0) {
                goto fail;
            }
            current = holder;
            count = 1;
        }
    }
done:
    if (current != NULL && append_stretch(out, current, count) < 0) {
        goto fail;
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef map_methods[] = {
    {"get", (PyCFunction)(void (*)(void))map_get, METH_FASTCALL,
     "get(digest, default=None) -> its holder, else default"},
    {"values", (PyCFunction)map_values, METH_NOARGS, "values() -> a list of the holders"},
    {"stretches", (PyCFunction)(void (*)(void))map_stretches, METH_FASTCALL,
     "stretches(tokens, size, root=0) -> the prompt's leading blocks held here, chained from "
     "root, as (holder, blocks) "
     "stretches held alike (the same holder object)"},
    {"__sizeof__", (PyCFunction)map_sizeof, METH_NOARGS, "bytes, with the table"},
    {"__class_getitem__", Py_GenericAlias, METH_O | METH_CLASS, "DigestMap[H]: for typing"},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods map_as_mapping = {
    .mp_length = (lenfunc)map_len,
    .mp_subscript = (binaryfunc)map_subscript,
    .mp_ass_subscript = (objobjargproc)map_ass_subscript,
};

static PySequenceMethods map_as_sequence = {
    .sq_contains = (objobjproc)map_contains,
};

static PyTypeObject DigestMapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvtier.apps.proxy._digests.DigestMap",
    .tp_doc = "DigestMap() -> a map of digests (ints of up to 128 bits) to holders",
    .tp_basicsize = sizeof(DigestMap),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = map_new,
    .tp_dealloc = (destructor)map_dealloc,
    .tp_traverse = (traverseproc)map_traverse,
    .tp_clear = (inquiry)map_clear,
    .tp_as_mapping = &map_as_mapping,
    .tp_as_sequence = &map_as_sequence,
    .tp_methods = map_methods,
};

static PyMethodDef methods[] = {
    {"chained", (PyCFunction)(void (*)(void))chained, METH_FASTCALL,
     "chained(digest, tokens, size) -> the digests of tokens' whole blocks, chained from digest"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_digests",
    .m_doc = "The proxy index's digests and lookups, compiled.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__digests(void)
{
    if (PyType_Ready(&DigestMapType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "DigestMap", (PyObject *)&DigestMapType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
