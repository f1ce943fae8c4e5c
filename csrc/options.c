/* The option values of the entry points, parsed from Python objects: scale, rotary, t5_bias's tuple, max_seqlen and
 * activation. Each raises a TypeError (wrong type) or ValueError (out of range) naming the argument and what came. */
#include "flashsci.h"

#include <math.h>

/* t5_bias=(table, num_buckets, max_distance, bidirectional). */
int fs_parse_t5(PyObject *t5, fs_t5_args *a)
{
    if (!PyTuple_Check(t5) || PyTuple_GET_SIZE(t5) != 4) {
        PyErr_Format(PyExc_TypeError, "t5_bias must be a tuple (table, num_buckets, max_distance, bidirectional), got %.100s",
                     Py_TYPE(t5)->tp_name);
        return -1;
    }
    a->table = PyTuple_GET_ITEM(t5, 0);
    for (int i = 1; i < 3; i++)
        if (!PyLong_Check(PyTuple_GET_ITEM(t5, i)) || PyBool_Check(PyTuple_GET_ITEM(t5, i))) {
            PyErr_Format(PyExc_TypeError, "t5_bias: %s must be an int, got %.100s", i == 1 ? "num_buckets" : "max_distance",
                         Py_TYPE(PyTuple_GET_ITEM(t5, i))->tp_name);
            return -1;
        }
    long long nb, md;
    const int nb_out = fs_int_in(PyTuple_GET_ITEM(t5, 1), 2, 1 << 16, &nb);
    const int md_out = nb_out < 0 ? -1 : fs_int_in(PyTuple_GET_ITEM(t5, 2), 1, INT32_MAX, &md);
    if (md_out < 0) return -1;
    if ((a->bidirectional = PyObject_IsTrue(PyTuple_GET_ITEM(t5, 3))) < 0) return -1;
    const long long max_exact = (a->bidirectional ? nb / 2 : nb) / 2;
    if (nb_out || md_out || max_exact < 1 || md <= max_exact) {
        PyErr_Format(PyExc_ValueError, "t5_bias: need num_buckets in [%d, 65536] and max_distance in (num_buckets%s / 2, "
                     "2**31) (T5 uses 32, 128), got num_buckets=%R, max_distance=%R", a->bidirectional ? 4 : 2,
                     a->bidirectional ? " / 2" : "", PyTuple_GET_ITEM(t5, 1), PyTuple_GET_ITEM(t5, 2));
        return -1;
    }
    a->buckets = (int)nb;
    a->max_distance = (int)md;
    return 0;
}

/* obj as a double; an int too large for one reads as infinity (the callers then refuse it as not finite). */
static int as_double(PyObject *obj, double *x)
{
    *x = PyFloat_AsDouble(obj);
    if (*x != -1.0 || !PyErr_Occurred()) return 0;
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
    PyErr_Clear();
    *x = INFINITY;
    return 0;
}

/* scale=: None (1/sqrt(D)) or a finite real number. */
int fs_parse_scale(PyObject *obj, int *has_scale, double *scale)
{
    if (obj == Py_None) return 0;
    if (!PyNumber_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "scale must be a float or None, got %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (as_double(obj, scale) < 0) return -1;
    if (!isfinite(*scale)) {
        PyErr_Format(PyExc_ValueError, "scale must be finite, got %R", obj);
        return -1;
    }
    *has_scale = 1;
    return 0;
}

/* rotary=: None/False (off), True (base 10000, ESM), or a positive base. */
int fs_parse_rotary(PyObject *obj, int *on, float *base)
{
    *on = 0;
    if (obj == Py_None || obj == Py_False) return 0;
    if (obj == Py_True) {
        *on = 1;
        *base = 10000.0f;
        return 0;
    }
    if (!PyNumber_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "rotary must be None, True or a base (float), got %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    double b;
    if (as_double(obj, &b) < 0) return -1;
    if (!isfinite(b) || b <= 1.0) {
        PyErr_Format(PyExc_ValueError, "rotary base must be a finite number above 1, got %R", obj);
        return -1;
    }
    *on = 1;
    *base = (float)b;
    return 0;
}

/* max_seqlen_q=, max_seqlen_k=: an int in [0, 2**30]. */
int fs_parse_max_seqlen(PyObject *obj, const char *name, long long *value)
{
    if (!PyIndex_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %.100s", name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *i = PyNumber_Index(obj);
    if (!i) return -1;
    const int outside = fs_int_in(i, 0, FS_MAX_DIM, value);
    Py_DECREF(i);
    if (outside < 0) return -1;
    if (outside) {
        PyErr_Format(PyExc_ValueError, "%s must be in [0, 2**30], got %R", name, obj);
        return -1;
    }
    return 0;
}

static const char *const act_names[FS_NUM_ACTS] = {"none", "relu", "gelu", "gelu_tanh", "silu"};

/* activation=: None or one of 'relu', 'gelu' (erf), 'gelu_tanh', 'silu'. */
int fs_parse_activation(PyObject *obj, fs_activation *act)
{
    *act = FS_ACT_NONE;
    if (obj == Py_None) return 0;
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "activation must be None or a str, got %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    for (int i = 1; i < FS_NUM_ACTS; i++)
        if (!PyUnicode_CompareWithASCIIString(obj, act_names[i])) {
            *act = (fs_activation)i;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "activation must be None, 'relu', 'gelu', 'gelu_tanh' or 'silu', got %R", obj);
    return -1;
}
