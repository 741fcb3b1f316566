/* dnnctl's native launch path: one C call per kernel launch (see dnnctl/backends/native.py).
 *
 * launch(handle, gx, gy, gz, bx, by, bz, smem, stream, kinds, args[, cooperative]) -> CUresult
 *   Packs ``args`` into an 8-byte-slot parameter block by ``kinds`` (one byte per argument:
 *   'P' pointer-like, 'i' int32, 'I' uint32, 'q' int64, 'Q' uint64, 'h' int16, 'b' int8,
 *   'B' uint8, 'f' float32, 'd' float64) and calls cuLaunchKernel. A pointer-like argument is
 *   None (null), an int (an address), an object with data_ptr() (torch), an object whose
 *   .data.ptr is the address (CuPy), or anything the Python fallback given to set_launch()
 *   turns into an int. A true ``cooperative`` calls cuLaunchCooperativeKernel (every block
 *   resident at once; its address given to set_launch) instead.
 * call_ints(fn, *ints) -> int
 *   Calls a C function of up to 24 integer / pointer arguments (the cuBLAS entry points we
 *   use take only those); every argument travels in a 64-bit slot, as the x86-64 and AArch64
 *   calling conventions pass them.
 *
 * The module links nothing: cuLaunchKernel's address comes from Python (ctypes) once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
typedef uint64_t u64;
typedef int (*ints_fn)(u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64,
                       u64, u64, u64, u64, u64, u64, u64, u64, u64, u64);

#define MAX_ARGS 96
#define MAX_TYPES 8

typedef int (*coop_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, void *, void **);
static launch_fn LAUNCH = NULL;
static coop_fn LAUNCH_COOP = NULL;
static PyObject *FALLBACK = NULL; /* Python callable: object -> int address */
static PyObject *S_DATA_PTR = NULL, *S_DATA = NULL, *S_PTR = NULL;

/* per-type strategy: 1 = data_ptr(), 2 = .data.ptr, 3 = Python fallback */
static PyTypeObject *TYPES[MAX_TYPES];
static int STRATEGY[MAX_TYPES];
static int NTYPES = 0;

static int strategy_of(PyTypeObject *t) {
    for (int i = 0; i < NTYPES; i++)
        if (TYPES[i] == t) return STRATEGY[i];
    int s = 3;
    if (PyObject_HasAttr((PyObject *)t, S_DATA_PTR)) s = 1;
    else if (PyObject_HasAttr((PyObject *)t, S_DATA)) s = 2;
    if (NTYPES < MAX_TYPES) {
        Py_INCREF(t);
        TYPES[NTYPES] = t;
        STRATEGY[NTYPES++] = s;
    }
    return s;
}

static int as_u64(PyObject *o, u64 *out) {
    /* an int (or anything with __index__) as 64 bits; negative values wrap */
    PyObject *idx = PyNumber_Index(o);
    if (!idx) return -1;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(idx, &overflow);
    if (overflow > 0) {
        *out = PyLong_AsUnsignedLongLong(idx);
    } else {
        *out = (u64)v;
    }
    Py_DECREF(idx);
    return PyErr_Occurred() ? -1 : 0;
}

static int ptr_of(PyObject *o, u64 *out) {
    if (o == Py_None) { *out = 0; return 0; }
    if (PyLong_CheckExact(o)) return as_u64(o, out);
    PyObject *r = NULL;
    switch (strategy_of(Py_TYPE(o))) {
    case 1:
        r = PyObject_CallMethodNoArgs(o, S_DATA_PTR);
        break;
    case 2: {
        PyObject *mem = PyObject_GetAttr(o, S_DATA);
        if (!mem) return -1;
        r = PyObject_GetAttr(mem, S_PTR);
        Py_DECREF(mem);
        if (!r) {  /* .data without .ptr (a NumPy scalar): the Python fallback decides */
            PyErr_Clear();
            break;
        }
        break;
    }
    default:
        break;
    }
    if (!r) {
        if (PyErr_Occurred()) return -1;
        if (FALLBACK == NULL) {
            PyErr_SetString(PyExc_TypeError, "no address for a kernel argument");
            return -1;
        }
        r = PyObject_CallOneArg(FALLBACK, o);
        if (!r) return -1;
    }
    int rc = as_u64(r, out);
    Py_DECREF(r);
    return rc;
}

static int pack(char kind, PyObject *o, unsigned char *slot) {
    u64 v = 0;
    memset(slot, 0, 8);
    switch (kind) {
    case 'P':
        if (ptr_of(o, &v)) return -1;
        memcpy(slot, &v, 8);
        return 0;
    case 'f': {
        double d = PyFloat_AsDouble(o);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        float f = (float)d;
        memcpy(slot, &f, 4);
        return 0;
    }
    case 'd': {
        double d = PyFloat_AsDouble(o);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        memcpy(slot, &d, 8);
        return 0;
    }
    default:
        break;
    }
    if (as_u64(o, &v)) return -1;
    switch (kind) {
    case 'i': case 'I': { uint32_t x = (uint32_t)v; memcpy(slot, &x, 4); return 0; }
    case 'q': case 'Q': memcpy(slot, &v, 8); return 0;
    case 'h': { uint16_t x = (uint16_t)v; memcpy(slot, &x, 2); return 0; }
    case 'b': case 'B': { uint8_t x = (uint8_t)v; memcpy(slot, &x, 1); return 0; }
    default:
        PyErr_Format(PyExc_ValueError, "unknown argument kind %c", kind);
        return -1;
    }
}

static PyObject *set_launch(PyObject *self, PyObject *args) {
    PyObject *addr, *fallback, *coop = NULL;
    if (!PyArg_ParseTuple(args, "OO|O", &addr, &fallback, &coop)) return NULL;
    u64 a, c = 0;
    if (as_u64(addr, &a)) return NULL;
    if (coop != NULL && coop != Py_None && as_u64(coop, &c)) return NULL;
    LAUNCH = (launch_fn)(uintptr_t)a;
    LAUNCH_COOP = (coop_fn)(uintptr_t)c;
    Py_XDECREF(FALLBACK);
    Py_INCREF(fallback);
    FALLBACK = fallback;
    Py_RETURN_NONE;
}

static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11 && nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "launch() takes 11 or 12 arguments");
        return NULL;
    }
    int coop = 0;
    if (nargs == 12) {
        coop = PyObject_IsTrue(args[11]);
        if (coop < 0) return NULL;
        if (coop && LAUNCH_COOP == NULL) {
            PyErr_SetString(PyExc_RuntimeError,
                            "launch(): no cuLaunchCooperativeKernel given to set_launch()");
            return NULL;
        }
    }
    if (LAUNCH == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "launch(): set_launch() was not called");
        return NULL;
    }
    u64 head[9];
    for (int i = 0; i < 9; i++)
        if (as_u64(args[i], &head[i])) return NULL;
    PyObject *kinds = args[9], *seq = args[10];
    if (!PyBytes_Check(kinds)) {
        PyErr_SetString(PyExc_TypeError, "launch(): kinds must be bytes");
        return NULL;
    }
    PyObject *fast = PySequence_Fast(seq, "launch(): args must be a sequence");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n != PyBytes_GET_SIZE(kinds) || n > MAX_ARGS) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "launch(): %zd arguments for %zd kinds (at most %d)",
                     n, PyBytes_GET_SIZE(kinds), MAX_ARGS);
        return NULL;
    }
    unsigned char buf[MAX_ARGS * 8];
    void *params[MAX_ARGS];
    const char *k = PyBytes_AS_STRING(kinds);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pack(k[i], items[i], buf + 8 * i)) {
            Py_DECREF(fast);
            return NULL;
        }
        params[i] = buf + 8 * i;
    }
    Py_DECREF(fast);
    int rc = coop ? LAUNCH_COOP((void *)(uintptr_t)head[0], (unsigned)head[1],
                                (unsigned)head[2], (unsigned)head[3], (unsigned)head[4],
                                (unsigned)head[5], (unsigned)head[6], (unsigned)head[7],
                                (void *)(uintptr_t)head[8], params)
                  : LAUNCH((void *)(uintptr_t)head[0], (unsigned)head[1], (unsigned)head[2],
                           (unsigned)head[3], (unsigned)head[4], (unsigned)head[5],
                           (unsigned)head[6], (unsigned)head[7], (void *)(uintptr_t)head[8],
                           params, NULL);
    return PyLong_FromLong(rc);
}

static PyObject *call_ints(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 25) {
        PyErr_SetString(PyExc_TypeError, "call_ints(fn, *ints): 0 to 24 integer arguments");
        return NULL;
    }
    u64 v[25] = {0};
    for (Py_ssize_t i = 0; i < nargs; i++)
        if (as_u64(args[i], &v[i])) return NULL;
    ints_fn fn = (ints_fn)(uintptr_t)v[0];
    int rc = fn(v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12],
                v[13], v[14], v[15], v[16], v[17], v[18], v[19], v[20], v[21], v[22], v[23],
                v[24]);
    return PyLong_FromLong(rc);
}

static PyMethodDef METHODS[] = {
    {"set_launch", set_launch, METH_VARARGS, "set_launch(cuLaunchKernel address, fallback[, cuLaunchCooperativeKernel address])"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(handle, gx, gy, gz, bx, by, bz, smem, stream, kinds, args[, coop]) -> CUresult"},
    {"call_ints", (PyCFunction)(void (*)(void))call_ints, METH_FASTCALL,
     "call_ints(fn, *ints) -> int"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_dnnctl_native", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__dnnctl_native(void) {
    S_DATA_PTR = PyUnicode_InternFromString("data_ptr");
    S_DATA = PyUnicode_InternFromString("data");
    S_PTR = PyUnicode_InternFromString("ptr");
    if (!S_DATA_PTR || !S_DATA || !S_PTR) return NULL;
    return PyModule_Create(&MODULE);
}
