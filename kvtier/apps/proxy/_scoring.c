/* kv-aware's passes over the fleet, compiled: one loop instead of a handful in Python.

    pick(in_flight, queued, recent, held, cost, bound, turn) -> (int, bool)

Every argument but the last two is a list with one number per engine (by position). Of the
engines with in_flight <= bound (eligible; at least one must be), it returns the one of least
(cost + queued, in_flight) and whether an eligible engine holds a different count of the prompt
(held) than it does (a cached prefix can win); when none does, the one of least (recent,
in_flight) instead, and False. Ties go to the first in round-robin order from turn. It is
scoring._kv_aware's Python passes, the same comparisons on the same doubles (the module is
optional: scoring falls back to those where it is not built).
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

static PyObject *
pick(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    static const char *names[] = {"in_flight", "queued", "recent", "held", "cost"};
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "pick(in_flight, queued, recent, held, cost, bound, turn)");
        return NULL;
    }
    PyObject **lists[5];
    Py_ssize_t n = -1;
    for (int k = 0; k < 5; k++) {
        if (!PyList_Check(args[k])) {
            PyErr_Format(PyExc_TypeError, "%s must be a list", names[k]);
            return NULL;
        }
        if (n >= 0 && PyList_GET_SIZE(args[k]) != n) {
            PyErr_Format(PyExc_ValueError, "%s has %zd engines, in_flight %zd", names[k],
                         PyList_GET_SIZE(args[k]), n);
            return NULL;
        }
        n = PyList_GET_SIZE(args[k]);
        lists[k] = ((PyListObject *)args[k])->ob_item;
    }
    double bound = PyFloat_AsDouble(args[5]);
    if (bound == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t turn = PyLong_AsSsize_t(args[6]);
    if (turn == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t start = n ? ((turn % n) + n) % n : 0;
    Py_ssize_t best = -1, spread = -1, best_rr = 0, spread_rr = 0;
    double best1 = 0, best2 = 0, spread1 = 0, spread2 = 0, first_held = 0;
    int differ = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double in_flight, queued, recent, held, cost;
        if (number(lists[0], i, &in_flight) < 0) {
            return NULL;
        }
        if (!(in_flight <= bound)) {
            continue;
        }
        if (number(lists[1], i, &queued) < 0 || number(lists[2], i, &recent) < 0 ||
            number(lists[3], i, &held) < 0 || number(lists[4], i, &cost) < 0) {
            return NULL;
        }
        Py_ssize_t rr = i >= start ? i - start : i - start + n;
        double key = cost + queued;
        if (best < 0) {
            first_held = held;
        } else if (held != first_held) {
            differ = 1;
        }
        if (best < 0 || less(key, in_flight, rr, best1, best2, best_rr)) {
            best = i, best1 = key, best2 = in_flight, best_rr = rr;
        }
        if (spread < 0 || less(recent, in_flight, rr, spread1, spread2, spread_rr)) {
            spread = i, spread1 = recent, spread2 = in_flight, spread_rr = rr;
        }
    }
    if (best < 0) {
        PyErr_SetString(PyExc_ValueError, "no engine is eligible (in_flight <= bound)");
        return NULL;
    }
    return Py_BuildValue("(nO)", differ ? best : spread, differ ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"pick", (PyCFunction)(void (*)(void))pick, METH_FASTCALL,
     "pick(in_flight, queued, recent, held, cost, bound, turn) -> (engine, a prefix won)"},
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
