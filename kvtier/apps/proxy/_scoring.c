/* kv-aware's decision, compiled: from the index's stretches to the engine, no Python step per
   engine or per group.

    decide(stretches, fleet, loads, blind, prompt_tokens, block_size, load_bound, turn,
           weights, other_weight) -> (int, int, bool)

stretches: a prompt's leading blocks as the index found them, (holders, blocks) each, in order;
holders.masks(fleet) -> (ways, holding, shared) says who holds them over fleet's positions:
ways, (tier, mask) each, cheapest tier first (an engine in the mask of the tier it loads them
from); holding, the mask of them all; shared, the tier every other engine loads them from, or
None. loads is (in_flight, queued, recent), one number per engine by position: each an array
of 8-byte C numbers (array 'q' or 'd', read in place) or a sequence of numbers; blind, the
positions whose index is not exact (holding nothing); weights, a tier's cost per token loaded
against one computed (other_weight: a tier not in it). A holder's masks are read packed
(pack(masks, engines) -> bytes) from where the holder keeps them for fleet, (fleet, masks,
packed) in its _masks (read in place where its class keeps _masks in a slot), else packed here
from what masks(fleet) answers.

The runs are followed as prefix_runs.runs_of follows them (groups of engines with the same run
so far, split at each stretch by tier, here as bit masks), each group scored as scoring._score
scores a run, and the engine picked as scoring._pick picks it, the same comparisons on the same
doubles: of the engines with in_flight <= bound (scoring._bound(in_flight, load_bound): one
is, unless a count is NaN), the one of least (cost + queued, in_flight), what it holds, and
True if an eligible engine holds a different count of the prompt; else the one of least
(recent, in_flight), what it holds, and False. Ties go to the first in round-robin order from
turn. This module is optional: scoring does the same in Python where it is not built.
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#if PY_BIG_ENDIAN
#error "masks are read as little-endian words"
#endif

#include <structmember.h>

#define MAX_TIERS 8 /* tiers in one run (GPU, CPU, DISK, REDIS and a few more) */

typedef struct {
    PyObject *tier; /* borrowed from a masks tuple, which the caller's holders keep */
    Py_ssize_t blocks;
} count_t;

typedef struct {
    uint64_t *mask; /* words of the group's engines */
    count_t counts[MAX_TIERS]; /* its run so far, tiers in the order first met (a dict's) */
    int tiers;
} group_t;

typedef struct { /* groups of engines, each with its mask words in the list's own region */
    group_t *groups;
    uint64_t *masks;
    Py_ssize_t count;
} list_t;

typedef struct {
    Py_ssize_t n, words; /* engines; words per mask */
    list_t going, next, ended; /* each holds at most n groups: they are disjoint, not empty */
    uint64_t *scratch; /* room for a mask being worked out */
} runs_t;

/* one engine count of loads, by position: an array of C numbers (array.array 'q' or 'd', read
   in place by the buffer protocol: one cache line per 8 engines) or a list or tuple of Python
   numbers */
typedef struct {
    PyObject *seq; /* a list or tuple (PySequence_Fast), or NULL when view is held */
    Py_buffer view;
    char format; /* the view's: 'q', 'l' or 'd' */
} counts_t;

/* counts[i] as a double; -1 with an error set when it is not a number. A float's or a small
   int's value is read from the object itself (no call). */
static inline int
count_at(const counts_t *counts, Py_ssize_t i, double *out)
{
    if (counts->seq == NULL) {
        const char *at = (const char *)counts->view.buf + i * counts->view.itemsize;
        if (counts->format == 'd') {
            memcpy(out, at, sizeof(double));
        } else {
            int64_t v;
            memcpy(&v, at, sizeof(v));
            *out = (double)v;
        }
        return 0;
    }
    PyObject *item = PySequence_Fast_ITEMS(counts->seq)[i];
    if (PyFloat_CheckExact(item)) {
        *out = PyFloat_AS_DOUBLE(item);
        return 0;
    }
    if (PyLong_CheckExact(item)) {
#if PY_VERSION_HEX >= 0x030C0000
        if (PyUnstable_Long_IsCompact((PyLongObject *)item)) {
            *out = (double)PyUnstable_Long_CompactValue((PyLongObject *)item);
            return 0;
        }
#else
        Py_ssize_t digits = Py_SIZE(item);
        if (digits >= -1 && digits <= 1) { /* |v| < 2**30 */
            *out = (double)digits * (double)((PyLongObject *)item)->ob_digit[0];
            return 0;
        }
#endif
    }
    *out = PyFloat_AsDouble(item);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* counts from obj: read in place when it is an array of 8-byte C numbers ('q', 'l', 'd'), else
   as its items (a list or tuple, or any iterable made one); its length in *n */
static int
read_counts(PyObject *obj, const char *name, counts_t *counts, Py_ssize_t *n)
{
    if (PyObject_CheckBuffer(obj)) {
        if (PyObject_GetBuffer(obj, &counts->view, PyBUF_FORMAT | PyBUF_ND) == 0) {
            const char *format = counts->view.format;
            char code = format[0] == '@' ? format[1] : format[0];
            if (counts->view.ndim == 1 && counts->view.itemsize == 8 &&
                (code == 'q' || code == 'l' || code == 'd') &&
                format[format[0] == '@' ? 2 : 1] == '\0') {
                counts->format = code;
                *n = counts->view.shape[0];
                return 0;
            }
            PyBuffer_Release(&counts->view);
        }
        PyErr_Clear(); /* another buffer: read as a sequence */
    }
    counts->seq = PySequence_Fast(obj, name);
    if (counts->seq == NULL) {
        return -1;
    }
    *n = PySequence_Fast_GET_SIZE(counts->seq);
    return 0;
}

static void
release_counts(counts_t *counts)
{
    if (counts->seq != NULL) {
        Py_CLEAR(counts->seq);
    } else if (counts->view.obj != NULL) {
        PyBuffer_Release(&counts->view);
    }
}

/* (a1, a2, a_rr) < (b1, b2, b_rr) */
static inline int
less(double a1, double a2, Py_ssize_t a_rr, double b1, double b2, Py_ssize_t b_rr)
{
    if (a1 != b1) {
        return a1 < b1;
    }
    if (a2 != b2) {
        return a2 < b2;
    }
    return a_rr < b_rr;
}

/* loads as three counts of n engines each */
static int
read_loads(PyObject *loads, counts_t counts[3], Py_ssize_t *n)
{
    static const char *names[] = {"in_flight", "queued", "recent"};
    if (!PyTuple_Check(loads) || PyTuple_GET_SIZE(loads) < 3) {
        PyErr_SetString(PyExc_TypeError, "loads must be (in_flight, queued, recent)");
        return -1;
    }
    for (int k = 0; k < 3; k++) {
        Py_ssize_t size;
        if (read_counts(PyTuple_GET_ITEM(loads, k), names[k], &counts[k], &size) < 0) {
            return -1;
        }
        if (k == 0) {
            *n = size;
        } else if (size != *n) {
            PyErr_Format(PyExc_ValueError, "%s has %zd engines, in_flight %zd", names[k], size,
                         *n);
            return -1;
        }
    }
    return 0;
}

/* a Python int mask of a fleet of n engines' positions into its words (an error past it) */
static int
read_mask(Py_ssize_t n, Py_ssize_t count, PyObject *mask, uint64_t *words)
{
    if (!PyLong_Check(mask)) {
        PyErr_SetString(PyExc_TypeError, "a mask must be an int");
        return -1;
    }
    size_t bytes = (size_t)count * 8;
#if PY_VERSION_HEX >= 0x030D0000
    Py_ssize_t need = PyLong_AsNativeBytes(
        mask, words, (Py_ssize_t)bytes,
        Py_ASNATIVEBYTES_LITTLE_ENDIAN | Py_ASNATIVEBYTES_UNSIGNED_BUFFER |
            Py_ASNATIVEBYTES_REJECT_NEGATIVE);
    if (need < 0) {
        return -1;
    }
    if ((size_t)need > bytes) {
        PyErr_SetString(PyExc_OverflowError, "a mask past the fleet");
        return -1;
    }
#else
    if (_PyLong_AsByteArray((PyLongObject *)mask, (unsigned char *)words, bytes, 1, 0) < 0) {
        return -1;
    }
#endif
    if (n % 64 && words[count - 1] >> (n % 64)) {
        PyErr_SetString(PyExc_ValueError, "a mask past the fleet");
        return -1;
    }
    return 0;
}

static int
any_bit(const uint64_t *mask, Py_ssize_t words)
{
    for (Py_ssize_t w = 0; w < words; w++) {
        if (mask[w]) {
            return 1;
        }
    }
    return 0;
}

/* a new group at the end of list; its run is run's plus blocks in tier (none: as run's) */
static group_t *
add_group(runs_t *runs, list_t *list, const group_t *run, PyObject *tier, Py_ssize_t blocks)
{
    if (list->count > runs->n) { /* more groups than engines: two overlap */
        PyErr_SetString(PyExc_ValueError, "masks() put an engine in two tiers' masks");
        return NULL;
    }
    group_t *group = &list->groups[list->count];
    *group = *run;
    group->mask = list->masks + list->count * runs->words;
    list->count++;
    if (tier == NULL) {
        return group;
    }
    for (int t = 0; t < group->tiers; t++) {
        PyObject *had = group->counts[t].tier;
        int same = had == tier ? 1 : PyObject_RichCompareBool(had, tier, Py_EQ);
        if (same < 0) {
            return NULL;
        }
        if (same) {
            group->counts[t].blocks += blocks;
            return group;
        }
    }
    if (group->tiers == MAX_TIERS) {
        PyErr_SetString(PyExc_ValueError, "more tiers in one run than kv-aware scores");
        return NULL;
    }
    group->counts[group->tiers++] = (count_t){tier, blocks};
    return group;
}

/* A holder's masks for a fleet, packed into one bytes object (pack, kept by the holder beside
   its masks): one buffer to read per stretch, not a tuple, its ways' tuples and their ints.

    int64 ways, engines; PyObject *shared (NULL: None); uint64 holding[words];
    then per way: PyObject *tier; uint64 mask[words]

   The tiers are borrowed from the masks tuple, which whoever keeps the bytes keeps too. */
typedef struct {
    int64_t ways, engines; /* the fleet's: its words, one per 64 engines (at least one) */
    PyObject *shared;
} packed_head;

#define WAY_BYTES(words) (sizeof(PyObject *) + (size_t)(words) * 8)

static PyObject *
pack_masks(PyObject *masks, Py_ssize_t n)
{
    if (!PyTuple_Check(masks) || PyTuple_GET_SIZE(masks) != 3) {
        PyErr_SetString(PyExc_TypeError, "masks() must return (ways, holding, shared)");
        return NULL;
    }
    PyObject *ways = PyTuple_GET_ITEM(masks, 0), *shared = PyTuple_GET_ITEM(masks, 2);
    if (!PyTuple_Check(ways)) {
        PyErr_SetString(PyExc_TypeError, "masks()'s ways must be a tuple");
        return NULL;
    }
    Py_ssize_t words = n > 64 ? (n + 63) / 64 : 1, count = PyTuple_GET_SIZE(ways);
    size_t head = sizeof(packed_head) + (size_t)words * 8;
    size_t bytes = head + (size_t)count * WAY_BYTES(words);
    PyObject *packed = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bytes);
    if (packed == NULL) {
        return NULL;
    }
    char *at = PyBytes_AS_STRING(packed);
    packed_head h = {count, n, shared == Py_None ? NULL : shared};
    memcpy(at, &h, sizeof(h));
    if (read_mask(n, words, PyTuple_GET_ITEM(masks, 1), (uint64_t *)(at + sizeof(h))) < 0) {
        goto fail;
    }
    for (Py_ssize_t w = 0; w < count; w++) {
        PyObject *way = PyTuple_GET_ITEM(ways, w);
        if (!PyTuple_Check(way) || PyTuple_GET_SIZE(way) != 2) {
            PyErr_SetString(PyExc_TypeError, "a way must be (tier, mask)");
            goto fail;
        }
        char *into = at + head + (size_t)w * WAY_BYTES(words);
        PyObject *tier = PyTuple_GET_ITEM(way, 0);
        memcpy(into, &tier, sizeof(tier));
        if (read_mask(n, words, PyTuple_GET_ITEM(way, 1), (uint64_t *)(into + sizeof(tier))) < 0) {
            goto fail;
        }
    }
    return packed;
fail:
    Py_DECREF(packed);
    return NULL;
}

static PyObject *
pack(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "pack(masks, engines)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "engines must be >= 0; got %zd", n);
        return NULL;
    }
    return pack_masks(args[0], n);
}

/* one stretch (its holder's packed masks): each going group splits by the tier its engines
   load it from (next), the others load it from the shared tier (next) or their runs end
   (ended) */
static int
split(runs_t *runs, PyObject *packed, Py_ssize_t blocks)
{
    const char *at = PyBytes_AS_STRING(packed);
    packed_head h;
    memcpy(&h, at, sizeof(h));
    Py_ssize_t words = runs->words;
    size_t head = sizeof(packed_head) + (size_t)words * 8;
    if (h.engines != runs->n ||
        (size_t)PyBytes_GET_SIZE(packed) != head + (size_t)h.ways * WAY_BYTES(words)) {
        PyErr_Format(PyExc_ValueError, "masks packed for a fleet of %lld engines, not %zd",
                     (long long)h.engines, runs->n);
        return -1;
    }
    const uint64_t *held = (const uint64_t *)(at + sizeof(h));
    uint64_t *part = runs->scratch;
    runs->next.count = 0;
    for (Py_ssize_t g = 0; g < runs->going.count; g++) {
        group_t *group = &runs->going.groups[g];
        for (int64_t w = 0; w < h.ways; w++) {
            const char *way = at + head + (size_t)w * WAY_BYTES(words);
            PyObject *tier;
            memcpy(&tier, way, sizeof(tier));
            const uint64_t *mask = (const uint64_t *)(way + sizeof(tier));
            for (Py_ssize_t k = 0; k < words; k++) {
                part[k] = mask[k] & group->mask[k];
            }
            if (any_bit(part, words)) {
                group_t *into = add_group(runs, &runs->next, group, tier, blocks);
                if (into == NULL) {
                    return -1;
                }
                memcpy(into->mask, part, (size_t)words * 8);
            }
        }
        for (Py_ssize_t k = 0; k < words; k++) {
            part[k] = group->mask[k] & ~held[k];
        }
        if (!any_bit(part, words)) {
            continue;
        }
        group_t *into = h.shared == NULL ? add_group(runs, &runs->ended, group, NULL, 0)
                                         : add_group(runs, &runs->next, group, h.shared, blocks);
        if (into == NULL) {
            return -1;
        }
        memcpy(into->mask, part, (size_t)words * 8);
    }
    list_t going = runs->going; /* next becomes going */
    runs->going = runs->next;
    runs->next = going;
    return 0;
}

/* scoring._score: the prompt tokens a run holds, and the prompt's cost there */
static int
score(const group_t *group, Py_ssize_t prompt, Py_ssize_t block_size, PyObject *weights,
      double other, Py_ssize_t *cached_out, double *cost_out)
{
    Py_ssize_t blocks = 0;
    for (int t = 0; t < group->tiers; t++) {
        blocks += group->counts[t].blocks;
    }
    Py_ssize_t total = blocks * block_size, last = prompt - 1;
    Py_ssize_t cached = total < last ? total : last > 0 ? last : 0;
    double loaded = 0.0;
    if (total) {
        double scale = (double)cached / (double)total;
        for (int t = 0; t < group->tiers; t++) {
            PyObject *weight = PyDict_GetItemWithError(weights, group->counts[t].tier);
            double w = other;
            if (weight != NULL) {
                w = PyFloat_AsDouble(weight);
                if (w == -1.0 && PyErr_Occurred()) {
                    return -1;
                }
            } else if (PyErr_Occurred()) {
                return -1;
            }
            loaded += w * (double)group->counts[t].blocks * (double)block_size * scale;
        }
    }
    *cached_out = cached;
    *cost_out = (double)(prompt - cached) + loaded;
    return 0;
}

/* where a holder's class keeps _masks: a slot (a member of __slots__) at this offset, read in
   place (no attribute lookup through the class, whose dict a cold decision meets missing from
   every cache); other classes are asked by name */
static PyObject *kept_name = NULL;
static PyTypeObject *slot_type = NULL; /* strong: the class whose offset is below */
static Py_ssize_t slot_offset = 0;

/* the holder's _masks slot (borrowed; NULL when unset), with *found 1; *found 0 when its class
   keeps _masks otherwise (ask by name); -1 with an error set */
static int
kept_slot(PyObject *holders, PyObject **kept)
{
    PyTypeObject *type = Py_TYPE(holders);
    if (type != slot_type) {
        if (kept_name == NULL && (kept_name = PyUnicode_InternFromString("_masks")) == NULL) {
            return -1;
        }
        PyObject *descr = _PyType_Lookup(type, kept_name); /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            return 0;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != T_OBJECT_EX || (member->flags & READONLY)) {
            return 0;
        }
        Py_XSETREF(slot_type, (PyTypeObject *)Py_NewRef(type));
        slot_offset = member->offset;
    }
    *kept = *(PyObject **)((char *)holders + slot_offset);
    return 1;
}

/* holders._masks, when they are kept for fleet packed: (fleet, masks, packed) (a new
   reference; NULL with no error set when they are not) */
static PyObject *
kept_for(PyObject *holders, PyObject *fleet, PyObject **masks)
{
    *masks = NULL;
    PyObject *kept;
    int found = kept_slot(holders, &kept);
    if (found < 0) {
        return NULL;
    }
    if (found) {
        kept = kept == NULL ? Py_NewRef(Py_None) : Py_NewRef(kept);
    } else if ((kept = PyObject_GetAttr(holders, kept_name)) == NULL) {
        return NULL;
    }
    if (PyTuple_Check(kept) && PyTuple_GET_SIZE(kept) >= 2 && PyTuple_GET_ITEM(kept, 0) == fleet) {
        if (PyTuple_GET_SIZE(kept) == 3 && PyBytes_CheckExact(PyTuple_GET_ITEM(kept, 2))) {
            return kept;
        }
        *masks = Py_NewRef(PyTuple_GET_ITEM(kept, 1)); /* kept, not packed */
    }
    Py_DECREF(kept);
    return NULL;
}

/* holders' masks for fleet, packed (borrowed: keep holds it, and the masks whose tiers it
   names): read from what the holders keep for the last fleet when it is this one, with no
   Python call; else holders.masks(fleet) (which keeps them) is asked, and what it answers
   packed here when it kept them unpacked, or not at all */
static PyObject *
kept_packed(PyObject *holders, PyObject *fleet, Py_ssize_t n, PyObject *keep)
{
    static PyObject *masks_name = NULL;
    if (masks_name == NULL && (masks_name = PyUnicode_InternFromString("masks")) == NULL) {
        return NULL;
    }
    PyObject *masks, *kept = kept_for(holders, fleet, &masks);
    if (kept == NULL && masks == NULL && !PyErr_Occurred()) {
        PyObject *made = PyObject_CallMethodOneArg(holders, masks_name, fleet);
        if (made == NULL) {
            return NULL;
        }
        kept = kept_for(holders, fleet, &masks);
        if (masks == NULL) {
            masks = made; /* kept nothing: packed here */
        } else {
            Py_DECREF(made);
        }
    }
    if (kept != NULL) {
        Py_XDECREF(masks);
        int failed = PyList_Append(keep, kept);
        Py_DECREF(kept);
        return failed < 0 ? NULL : PyTuple_GET_ITEM(kept, 2);
    }
    if (masks == NULL || PyErr_Occurred()) {
        Py_XDECREF(masks);
        return NULL;
    }
    PyObject *packed = pack_masks(masks, n);
    int failed = packed == NULL || PyList_Append(keep, masks) < 0 ||
                 PyList_Append(keep, packed) < 0;
    Py_DECREF(masks);
    Py_XDECREF(packed);
    return failed ? NULL : packed;
}

/* every stretch's packed masks asked of memory at once, before they are read one by one:
   each is three objects away (the stretch's tuple, its holder, the holder's _masks), which a
   decision between requests mostly meets missing from every cache; here the misses of one
   stretch overlap the others' (nothing is checked but types: decide reads them again) */
static void
fetch_packed(PyObject *stretches)
{
    Py_ssize_t count = PySequence_Fast_GET_SIZE(stretches);
    PyObject **items = PySequence_Fast_ITEMS(stretches);
    for (Py_ssize_t s = 0; s < count; s++) {
        PyObject *stretch = items[s];
        if (!PyTuple_CheckExact(stretch) || PyTuple_GET_SIZE(stretch) != 2) {
            continue;
        }
        PyObject *holders = PyTuple_GET_ITEM(stretch, 0), *kept;
        if (Py_TYPE(holders) != slot_type || kept_slot(holders, &kept) <= 0 || kept == NULL) {
            continue;
        }
        if (PyTuple_CheckExact(kept) && PyTuple_GET_SIZE(kept) == 3 &&
            PyBytes_CheckExact(PyTuple_GET_ITEM(kept, 2))) {
            __builtin_prefetch(PyBytes_AS_STRING(PyTuple_GET_ITEM(kept, 2)));
        }
    }
}

/* decide's room for a fleet of up to SMALL_FLEET engines, on the stack (about 31 KB): a
   fleet's groups and masks allocated each call cost as much as the rest of the decision */
#define SMALL_FLEET 64
typedef struct {
    group_t pool[3 * SMALL_FLEET + 3]; /* going, next and ended: n + 1 groups each */
    uint64_t masks[3 * SMALL_FLEET + 4]; /* one word per mask, and one of scratch */
    int group_of[SMALL_FLEET + 1];
    Py_ssize_t helds[SMALL_FLEET + 2];
    double costs[SMALL_FLEET + 2];
} small_t;

static PyObject *
decide(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "decide(stretches, fleet, loads, blind, prompt_tokens, block_size, "
                        "load_bound, turn, weights, other_weight)");
        return NULL;
    }
    PyObject *fleet = args[1], *weights = args[8];
    counts_t counts[3];
    PyObject *stretches = NULL, *blind = NULL, *result = NULL;
    PyObject *keep = PyList_New(0);
    memset(counts, 0, sizeof(counts));
    runs_t runs = {0};
    group_t *pool = NULL;
    uint64_t *masks = NULL;
    int *group_of = NULL;
    Py_ssize_t *helds = NULL;
    double *costs = NULL;
    small_t small; /* a fleet of SMALL_FLEET engines or fewer: no allocation */
    int allocated = 0;
    Py_ssize_t prompt = PyLong_AsSsize_t(args[4]);
    Py_ssize_t block_size = PyLong_AsSsize_t(args[5]);
    double load_bound = PyFloat_AsDouble(args[6]);
    Py_ssize_t turn = PyLong_AsSsize_t(args[7]);
    double other = PyFloat_AsDouble(args[9]);
    if (keep == NULL || PyErr_Occurred() || read_loads(args[2], counts, &runs.n) < 0) {
        goto done;
    }
    if (!PyDict_Check(weights)) {
        PyErr_SetString(PyExc_TypeError, "weights must be a dict");
        goto done;
    }
    stretches = PySequence_Fast(args[0], "stretches must be a sequence");
    blind = PySequence_Fast(args[3], "blind must be iterable");
    if (stretches == NULL || blind == NULL) {
        goto done;
    }
    Py_ssize_t n = runs.n, words = (n + 63) / 64;
    runs.words = words ? words : 1;
    if (n <= SMALL_FLEET) { /* set as each is added */
        pool = small.pool, masks = small.masks, group_of = small.group_of;
        helds = small.helds, costs = small.costs;
    } else {
        allocated = 1;
        pool = PyMem_Malloc((size_t)(3 * n + 3) * sizeof(group_t));
        masks = PyMem_Malloc((size_t)((3 * n + 4) * runs.words) * 8);
        group_of = PyMem_Malloc((size_t)(n + 1) * sizeof(int));
        helds = PyMem_Malloc((size_t)(n + 2) * sizeof(Py_ssize_t));
        costs = PyMem_Malloc((size_t)(n + 2) * sizeof(double));
    }
    if (pool == NULL || masks == NULL || group_of == NULL || helds == NULL || costs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    runs.going = (list_t){pool, masks, 0};
    runs.next = (list_t){pool + n + 1, masks + (n + 1) * runs.words, 0};
    runs.ended = (list_t){pool + 2 * n + 2, masks + (2 * n + 2) * runs.words, 0};
    runs.scratch = masks + (3 * n + 3) * runs.words;
    if (n) { /* the whole fleet, with an empty run */
        group_t empty = {0};
        group_t *all = add_group(&runs, &runs.going, &empty, NULL, 0);
        memset(all->mask, 0, (size_t)runs.words * 8);
        for (Py_ssize_t i = 0; i < n; i++) {
            all->mask[i / 64] |= (uint64_t)1 << (i % 64);
        }
    }
    fetch_packed(stretches);
    for (Py_ssize_t s = 0; s < PySequence_Fast_GET_SIZE(stretches) && runs.going.count; s++) {
        PyObject *stretch = PySequence_Fast_GET_ITEM(stretches, s);
        if (!PyTuple_Check(stretch) || PyTuple_GET_SIZE(stretch) != 2) {
            PyErr_SetString(PyExc_TypeError, "a stretch must be (holders, blocks)");
            goto done;
        }
        Py_ssize_t blocks = PyLong_AsSsize_t(PyTuple_GET_ITEM(stretch, 1));
        if (blocks == -1 && PyErr_Occurred()) {
            goto done;
        }
        PyObject *packed = kept_packed(PyTuple_GET_ITEM(stretch, 0), fleet, n, keep);
        if (packed == NULL || split(&runs, packed, blocks) < 0) {
            goto done;
        }
    }
    /* every engine's group: the going ones, then the ended (between them, every engine);
       then the blind, in the slot after them */
    Py_ssize_t groups = runs.going.count + runs.ended.count;
    for (Py_ssize_t i = 0; i < n; i++) {
        group_of[i] = (int)groups;
    }
    for (Py_ssize_t g = 0; g < groups; g++) {
        group_t *group = g < runs.going.count ? &runs.going.groups[g]
                                              : &runs.ended.groups[g - runs.going.count];
        if (score(group, prompt, block_size, weights, other, &helds[g], &costs[g]) < 0) {
            goto done;
        }
        for (Py_ssize_t w = 0; w < words; w++) {
            for (uint64_t bits = group->mask[w]; bits; bits &= bits - 1) {
                group_of[w * 64 + __builtin_ctzll(bits)] = (int)g;
            }
        }
    }
    helds[groups] = 0, costs[groups] = (double)prompt;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(blind); k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(blind, k));
        if (i == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (i < 0 || i >= n) {
            PyErr_Format(PyExc_IndexError, "blind position %zd of a fleet of %zd", i, n);
            goto done;
        }
        group_of[i] = (int)groups;
    }
    /* scoring._bound: the most in flight an engine may have before this request */
    double total = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double flight;
        if (count_at(&counts[0], i, &flight) < 0) {
            goto done;
        }
        total += flight;
    }
    double mean = (total + 1.0) / (double)n; /* with this request */
    double bound = (load_bound * mean > mean + 1.0 ? load_bound * mean : mean + 1.0) - 1.0;
    Py_ssize_t start = n ? ((turn % n) + n) % n : 0;
    Py_ssize_t best = -1, spread = -1, best_rr = 0, spread_rr = 0, first_held = 0;
    double best1 = 0, best2 = 0, spread1 = 0, spread2 = 0;
    int differ = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double flight, queue, lately;
        if (count_at(&counts[0], i, &flight) < 0) {
            goto done;
        }
        if (!(flight <= bound)) {
            continue;
        }
        if (count_at(&counts[1], i, &queue) < 0 || count_at(&counts[2], i, &lately) < 0) {
            goto done;
        }
        int g = group_of[i];
        Py_ssize_t rr = i >= start ? i - start : i - start + n;
        double key = costs[g] + queue;
        if (best < 0) {
            first_held = helds[g];
        } else if (helds[g] != first_held) {
            differ = 1;
        }
        if (best < 0 || less(key, flight, rr, best1, best2, best_rr)) {
            best = i, best1 = key, best2 = flight, best_rr = rr;
        }
        if (spread < 0 || less(lately, flight, rr, spread1, spread2, spread_rr)) {
            spread = i, spread1 = lately, spread2 = flight, spread_rr = rr;
        }
    }
    if (best < 0) {
        PyErr_SetString(PyExc_ValueError, "no engine is eligible (in_flight <= bound)");
        goto done;
    }
    Py_ssize_t chosen = differ ? best : spread;
    result = Py_BuildValue("(nnO)", chosen, helds[group_of[chosen]], differ ? Py_True : Py_False);
done:
    for (int k = 0; k < 3; k++) {
        release_counts(&counts[k]);
    }
    Py_XDECREF(stretches);
    Py_XDECREF(blind);
    Py_XDECREF(keep);
    if (allocated) {
        PyMem_Free(pool);
        PyMem_Free(masks);
        PyMem_Free(group_of);
        PyMem_Free(helds);
        PyMem_Free(costs);
    }
    return result;
}

static PyMethodDef methods[] = {
    {"pack", (PyCFunction)(void (*)(void))pack, METH_FASTCALL,
     "pack(masks, engines) -> masks() over a fleet of that many engines, packed for decide"},
    {"decide", (PyCFunction)(void (*)(void))decide, METH_FASTCALL,
     "decide(stretches, fleet, loads, blind, prompt_tokens, block_size, load_bound, turn, "
     "weights, other_weight) -> (engine, the prompt tokens it holds, a prefix won)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_scoring",
    .m_doc = "kv-aware's decision, compiled.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__scoring(void)
{
    return PyModule_Create(&module);
}
