/* kv-aware's passes over the fleet, compiled: one loop over the engines, no Python step each.

    pick(loads, held, cost, apart, bound, turn) -> (int, held, bool)

loads is (in_flight, queued, recent), sequences with one number per engine (by position). Every
engine holds held prompt tokens at cost, but those of each group of apart, a sequence of
(held, cost, positions) (in order: a later group overrides). Of the engines with in_flight <=
bound (eligible; at least one must be), it returns the one of least (cost + queued, in_flight),
what it holds, and whether an eligible engine holds a different count of the prompt (a cached
prefix can win); when none does, the one of least (recent, in_flight) instead, what it holds,
and False. Ties go to the first in round-robin order from turn. It is scoring._pick, the same
comparisons on the same doubles (this module is optional: scoring falls back to _pick where it
is not built).
*/

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* items[i] as a double; -1 with an error set when it is not a number */
static inline int
number(PyObject **items, Py_ssize_t i, double *out)
{
    PyObject *item = items[i];
    *out = PyFloat_CheckExact(item) ? PyFloat_AS_DOUBLE(item) : PyFloat_AsDouble(item);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
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

/* the engines' counts: loads[k] as a fast sequence of n items (n: that of the first) */
static int
counts(PyObject *loads, PyObject *seqs[3], Py_ssize_t *n)
{
    static const char *names[] = {"in_flight", "queued", "recent"};
    if (!PyTuple_Check(loads) || PyTuple_GET_SIZE(loads) < 3) {
        PyErr_SetString(PyExc_TypeError, "loads must be (in_flight, queued, recent)");
        return -1;
    }
    for (int k = 0; k < 3; k++) {
        seqs[k] = PySequence_Fast(PyTuple_GET_ITEM(loads, k), names[k]);
        if (seqs[k] == NULL) {
            return -1;
        }
        Py_ssize_t size = PySequence_Fast_GET_SIZE(seqs[k]);
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

/* group[i] = g for each position i of each group g of apart (later groups override); the
   groups' held objects and costs into held[g], cost[g] */
static int
groups(PyObject *apart, Py_ssize_t n, int *group, PyObject **held, double *cost)
{
    Py_ssize_t count = PySequence_Fast_GET_SIZE(apart);
    for (Py_ssize_t g = 0; g < count; g++) {
        PyObject *item = PySequence_Fast_GET_ITEM(apart, g);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError, "apart: (held, cost, positions) each");
            return -1;
        }
        held[g] = PyTuple_GET_ITEM(item, 0);
        cost[g] = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 1));
        if (cost[g] == -1.0 && PyErr_Occurred()) {
            return -1;
        }
        PyObject *at = PySequence_Fast(PyTuple_GET_ITEM(item, 2), "positions must be iterable");
        if (at == NULL) {
            return -1;
        }
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(at); k++) {
            Py_ssize_t i = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(at, k));
            if (i == -1 && PyErr_Occurred()) {
                Py_DECREF(at);
                return -1;
            }
            if (i < 0 || i >= n) {
                PyErr_Format(PyExc_IndexError, "position %zd of a fleet of %zd", i, n);
                Py_DECREF(at);
                return -1;
            }
            group[i] = (int)g;
        }
        Py_DECREF(at);
    }
    return 0;
}

static PyObject *
pick(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "pick(loads, held, cost, apart, bound, turn)");
        return NULL;
    }
    PyObject *seqs[3] = {NULL, NULL, NULL}, *apart = NULL, *result = NULL;
    int *group = NULL;
    PyObject **helds = NULL;
    double *costs = NULL, *held_values = NULL;
    Py_ssize_t n = 0;
    double common_cost = PyFloat_AsDouble(args[2]);
    double bound = PyFloat_AsDouble(args[4]);
    Py_ssize_t turn = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred() || counts(args[0], seqs, &n) < 0) {
        goto done;
    }
    apart = PySequence_Fast(args[3], "apart must be a sequence");
    if (apart == NULL) {
        goto done;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(apart);
    group = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int));
    helds = PyMem_Malloc((size_t)(count + 1) * sizeof(PyObject *));
    costs = PyMem_Malloc((size_t)(count + 1) * sizeof(double));
    held_values = PyMem_Malloc((size_t)(count + 1) * sizeof(double));
    if (group == NULL || helds == NULL || costs == NULL || held_values == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        group[i] = (int)count; /* the last slot: the common one */
    }
    helds[count] = args[1];
    costs[count] = common_cost;
    if (groups(apart, n, group, helds, costs) < 0) {
        goto done;
    }
    for (Py_ssize_t g = 0; g <= count; g++) {
        held_values[g] = PyFloat_AsDouble(helds[g]);
        if (held_values[g] == -1.0 && PyErr_Occurred()) {
            goto done;
        }
    }
    PyObject **in_flight = PySequence_Fast_ITEMS(seqs[0]);
    PyObject **queued = PySequence_Fast_ITEMS(seqs[1]);
    PyObject **recent = PySequence_Fast_ITEMS(seqs[2]);
    Py_ssize_t start = n ? ((turn % n) + n) % n : 0;
    Py_ssize_t best = -1, spread = -1, best_rr = 0, spread_rr = 0;
    double best1 = 0, best2 = 0, spread1 = 0, spread2 = 0, first_held = 0;
    int differ = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double flight, queue, lately;
        if (number(in_flight, i, &flight) < 0) {
            goto done;
        }
        if (!(flight <= bound)) {
            continue;
        }
        if (number(queued, i, &queue) < 0 || number(recent, i, &lately) < 0) {
            goto done;
        }
        int g = group[i];
        Py_ssize_t rr = i >= start ? i - start : i - start + n;
        double key = costs[g] + queue;
        if (best < 0) {
            first_held = held_values[g];
        } else if (held_values[g] != first_held) {
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
    result = Py_BuildValue("(nOO)", chosen, helds[group[chosen]], differ ? Py_True : Py_False);
done:
    for (int k = 0; k < 3; k++) {
        Py_XDECREF(seqs[k]);
    }
    Py_XDECREF(apart);
    PyMem_Free(group);
    PyMem_Free(helds);
    PyMem_Free(costs);
    PyMem_Free(held_values);
    return result;
}

static PyMethodDef methods[] = {
    {"pick", (PyCFunction)(void (*)(void))pick, METH_FASTCALL,
     "pick(loads, held, cost, apart, bound, turn) -> (engine, its held, a prefix won)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_scoring",
    .m_doc = "kv-aware's passes over the fleet, compiled.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__scoring(void)
{
    return PyModule_Create(&module);
}
