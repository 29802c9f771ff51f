/* A native stand-in for the simulation mode's fast path (benchmarks/interception_floor.py):
   what a compiled hot path would cost at least. Per call: the fast path's three stack and hook
   questions, each tensor argument's storage and mark read, the call, and the output storage's
   mark (a weakref with a native callback, kept in a set) with a counting allocator; the
   callback is the free. CUDA's caching allocator (its split, merge and statistics) is left out:
   a compiled port of it would add its own cost on top. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *tensor_type, *parameter_type, *tf_len, *dispatch_len, *hooks, *false_obj;
static PyObject *mark_name, *storage_name, *live, *on_death;
static long long allocated, peak, allocations;

/* 1 and the tensor's storage marked, 0 unmarked, -1 an error */
static int marked(PyObject *t) {
    PyObject *s = PyObject_CallMethodNoArgs(t, storage_name);
    if (s == NULL) return -1;
    PyObject *m = PyObject_GetAttr(s, mark_name);
    Py_DECREF(s);
    if (m == NULL) { PyErr_Clear(); return 0; }
    Py_DECREF(m);
    return 1;
}

static int is_plain_tensor(PyObject *x) {
    return Py_TYPE(x) == (PyTypeObject *)tensor_type || Py_TYPE(x) == (PyTypeObject *)parameter_type;
}

static PyObject *death(PyObject *self, PyObject *ref) {
    allocated -= 512;
    if (PySet_Discard(live, ref) < 0) return NULL;
    Py_RETURN_NONE;
}

/* int 0 where the stack or hook question says "fall back", 1 where the fast path may go on */
static int asks(void) {
    PyObject *r = PyObject_CallNoArgs(tf_len);
    if (r == NULL) return -1;
    long n = PyLong_AsLong(r); Py_DECREF(r);
    r = PyObject_CallNoArgs(dispatch_len);
    if (r == NULL) return -1;
    n += PyLong_AsLong(r); Py_DECREF(r);
    r = PyObject_CallOneArg(hooks, false_obj);
    if (r == NULL) return -1;
    int none = r == Py_None; Py_DECREF(r);
    return n == 0 && none;
}

/* the mode's __torch_function__, bound to the mode: (mode, func, types, args, kwargs) */
static PyObject *torch_function(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs < 3) { PyErr_SetString(PyExc_TypeError, "expected (mode, func, types, ...)"); return NULL; }
    PyObject *func = argv[1];
    PyObject *args = nargs > 3 ? argv[3] : NULL;
    PyObject *kwargs = nargs > 4 && argv[4] != Py_None ? argv[4] : NULL;
    if (asks() < 0) return NULL;
    if (args != NULL) {
        Py_ssize_t n = PyTuple_GET_SIZE(args);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *x = PyTuple_GET_ITEM(args, i);
            if (is_plain_tensor(x) && marked(x) < 0) return NULL;
        }
    }
    PyObject *empty = NULL;
    if (args == NULL) { empty = PyTuple_New(0); args = empty; }
    PyObject *out = PyObject_Call(func, args, kwargs);
    Py_XDECREF(empty);
    if (out == NULL) return NULL;
    if (Py_TYPE(out) == (PyTypeObject *)tensor_type) {
        PyObject *s = PyObject_CallMethodNoArgs(out, storage_name);
        if (s == NULL) { Py_DECREF(out); return NULL; }
        PyObject *m = PyObject_GetAttr(s, mark_name);
        if (m != NULL) {
            Py_DECREF(m);
        } else {
            PyErr_Clear();
            PyObject *ref = PyWeakref_NewRef(s, on_death);
            if (ref == NULL || PySet_Add(live, ref) < 0 || PyObject_SetAttr(s, mark_name, ref) < 0) {
                Py_XDECREF(ref); Py_DECREF(s); Py_DECREF(out); return NULL;
            }
            Py_DECREF(ref);
            allocated += 512; allocations++;
            if (allocated > peak) peak = allocated;
        }
        Py_DECREF(s);
    }
    return out;
}

static PyObject *setup(PyObject *self, PyObject *args) {
    if (!PyArg_ParseTuple(args, "OOOOO", &tensor_type, &parameter_type, &tf_len, &dispatch_len, &hooks))
        return NULL;
    Py_INCREF(tensor_type); Py_INCREF(parameter_type);
    Py_INCREF(tf_len); Py_INCREF(dispatch_len); Py_INCREF(hooks);
    Py_RETURN_NONE;
}

static PyObject *counts(PyObject *self, PyObject *unused) {
    return Py_BuildValue("LLLn", allocated, peak, allocations, PySet_GET_SIZE(live));
}

static PyMethodDef methods[] = {
    {"torch_function", (PyCFunction)(void (*)(void))torch_function, METH_FASTCALL, "the mode's call"},
    {"setup", setup, METH_VARARGS, "the types and torch's questions"},
    {"counts", counts, METH_NOARGS, "(bytes held, peak, allocations, live marks)"},
    {NULL, NULL, 0, NULL}};
static PyMethodDef death_def = {"death", death, METH_O, "a marked storage's free"};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "interception_floor", NULL, -1, methods};

PyMODINIT_FUNC PyInit_interception_floor(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    mark_name = PyUnicode_InternFromString("_floor_mark");
    storage_name = PyUnicode_InternFromString("untyped_storage");
    live = PySet_New(NULL);
    on_death = PyCFunction_New(&death_def, NULL);
    false_obj = Py_False; Py_INCREF(false_obj);
    if (!mark_name || !storage_name || !live || !on_death) { Py_DECREF(m); return NULL; }
    return m;
}
