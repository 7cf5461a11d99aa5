/* The judge's timing loop, in compiled code.
 *
 * Candidate code shares its process with the loop that times it. Written in Python,
 * that loop reads timers and events through names the candidate can rebind
 * (time.perf_counter, torch.cuda.Event.elapsed_time, the profiler's own methods). Here
 * the host clock is clock_gettime and the device clock is CUDA events recorded and read
 * through the CUDA runtime that the process has loaded, resolved once with dlsym:
 * nothing the candidate rebinds in Python changes what is measured.
 *
 * run_loop(calls, n, prepare=None, after=None, stream=-1, flush_ptr=0, flush_bytes=0,
 *          sync_each=False) -> (device_ms | None, host_ms)
 *
 *   for j in range(n):
 *       prepare(j)                      untimed (inputs changed in place)
 *       memset(flush buffer)            untimed (the L2 cache emptied)
 *       [device synchronised]           with sync_each
 *       start event / host clock
 *       calls[j % len(calls)]()         timed
 *       end event / host clock          (host after a device synchronise with sync_each)
 *       after(j, result)                untimed (a checksum of the result)
 *   device synchronised, event times read
 *
 * stream < 0 times on the host only (the CPU backend): device_ms is None.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef int cuda_err;
typedef void *cuda_event;
typedef void *cuda_stream;

static cuda_err (*ev_create)(cuda_event *, unsigned int);
static cuda_err (*ev_destroy)(cuda_event);
static cuda_err (*ev_record)(cuda_event, cuda_stream);
static cuda_err (*ev_elapsed)(float *, cuda_event, cuda_event);
static cuda_err (*mem_set_async)(void *, int, size_t, cuda_stream);
static cuda_err (*dev_sync)(void);
static const char *(*err_string)(cuda_err);
static int cuda_ready = 0;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static PyObject *init_cuda(PyObject *self, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL) h = dlopen(path, RTLD_NOW);
    if (h == NULL) {
        PyErr_Format(PyExc_OSError, "cannot open the CUDA runtime %s: %s", path, dlerror());
        return NULL;
    }
#define RESOLVE(var, name)                                                                 \
    *(void **)(&var) = dlsym(h, name);                                                     \
    if (var == NULL) {                                                                     \
        PyErr_Format(PyExc_OSError, "the CUDA runtime %s has no %s", path, name);          \
        return NULL;                                                                       \
    }
    RESOLVE(ev_create, "cudaEventCreateWithFlags");
    RESOLVE(ev_destroy, "cudaEventDestroy");
    RESOLVE(ev_record, "cudaEventRecord");
    RESOLVE(ev_elapsed, "cudaEventElapsedTime");
    RESOLVE(mem_set_async, "cudaMemsetAsync");
    RESOLVE(dev_sync, "cudaDeviceSynchronize");
    RESOLVE(err_string, "cudaGetErrorString");
#undef RESOLVE
    cuda_ready = 1;
    Py_RETURN_NONE;
}

static int cuda_check(cuda_err rc, const char *what) {
    if (rc == 0) return 0;
    PyErr_Format(PyExc_RuntimeError, "CUDA error in the timing loop (%s): %s (%d)", what,
                 err_string ? err_string(rc) : "?", rc);
    return -1;
}

static PyObject *run_loop(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"calls", "n", "prepare", "after", "stream", "flush_ptr",
                            "flush_bytes", "sync_each", NULL};
    PyObject *calls_obj, *prepare = Py_None, *after = Py_None;
    Py_ssize_t n;
    long long stream = -1;
    unsigned long long flush_ptr = 0, flush_bytes = 0;
    int sync_each = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "On|OOLKKp", names, &calls_obj, &n, &prepare,
                                     &after, &stream, &flush_ptr, &flush_bytes, &sync_each))
        return NULL;
    PyObject *calls = PySequence_Fast(calls_obj, "calls must be a sequence of callables");
    if (calls == NULL) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(calls);
    if (k <= 0 || n <= 0) {
        Py_DECREF(calls);
        PyErr_SetString(PyExc_ValueError, "run_loop needs at least one call and n >= 1");
        return NULL;
    }
    int device = stream >= 0;
    if (device && !cuda_ready) {
        Py_DECREF(calls);
        PyErr_SetString(PyExc_RuntimeError, "run_loop on a stream before init_cuda()");
        return NULL;
    }
    cuda_stream st = (cuda_stream)(uintptr_t)(stream >= 0 ? stream : 0);
    double *host = calloc((size_t)n, sizeof(double));
    cuda_event *starts = device ? calloc((size_t)n, sizeof(cuda_event)) : NULL;
    cuda_event *ends = device ? calloc((size_t)n, sizeof(cuda_event)) : NULL;
    PyObject *result = NULL, *dev_list = NULL, *host_list = NULL;
    Py_ssize_t made = 0;
    if (host == NULL || (device && (starts == NULL || ends == NULL))) {
        PyErr_NoMemory();
        goto done;
    }
    if (device) {
        for (; made < n; ++made) {
            if (cuda_check(ev_create(&starts[made], 0), "event create")) goto done;
            if (cuda_check(ev_create(&ends[made], 0), "event create")) {
                ev_destroy(starts[made]);
                goto done;
            }
        }
    }
    for (Py_ssize_t j = 0; j < n; ++j) {
        PyObject *fn = PySequence_Fast_GET_ITEM(calls, j % k);
        if (prepare != Py_None) {
            PyObject *r = PyObject_CallFunction(prepare, "n", j);
            if (r == NULL) goto done;
            Py_DECREF(r);
        }
        if (device && flush_bytes > 0 &&
            cuda_check(mem_set_async((void *)(uintptr_t)flush_ptr, (int)(j & 0xff), (size_t)flush_bytes, st),
                       "L2 flush"))
            goto done;
        if (device && sync_each && cuda_check(dev_sync(), "synchronize")) goto done;
        if (device && cuda_check(ev_record(starts[j], st), "event record")) goto done;
        double t0 = now_ms();
        PyObject *out = PyObject_CallNoArgs(fn);
        if (out == NULL) goto done;
        if (device && cuda_check(ev_record(ends[j], st), "event record")) {
            Py_DECREF(out);
            goto done;
        }
        if (device && sync_each && cuda_check(dev_sync(), "synchronize")) {
            Py_DECREF(out);
            goto done;
        }
        host[j] = now_ms() - t0;
        if (after != Py_None) {
            PyObject *r = PyObject_CallFunction(after, "nO", j, out);
            if (r == NULL) {
                Py_DECREF(out);
                goto done;
            }
            Py_DECREF(r);
        }
        Py_DECREF(out);
    }
    if (device) {
        if (cuda_check(dev_sync(), "synchronize")) goto done;
        dev_list = PyList_New(n);
        if (dev_list == NULL) goto done;
        for (Py_ssize_t j = 0; j < n; ++j) {
            float ms = 0.f;
            if (cuda_check(ev_elapsed(&ms, starts[j], ends[j]), "elapsed time")) goto done;
            PyList_SET_ITEM(dev_list, j, PyFloat_FromDouble((double)ms));
        }
    }
    host_list = PyList_New(n);
    if (host_list == NULL) goto done;
    for (Py_ssize_t j = 0; j < n; ++j) PyList_SET_ITEM(host_list, j, PyFloat_FromDouble(host[j]));
    if (dev_list == NULL) {
        Py_INCREF(Py_None);
        dev_list = Py_None;
    }
    result = PyTuple_Pack(2, dev_list, host_list);
done:
    if (device) {
        for (Py_ssize_t j = 0; j < made; ++j) {
            ev_destroy(starts[j]);
            ev_destroy(ends[j]);
        }
    }
    free(starts);
    free(ends);
    free(host);
    Py_XDECREF(dev_list);
    Py_XDECREF(host_list);
    Py_DECREF(calls);
    return result;
}

static PyObject *host_ms(PyObject *self, PyObject *unused) { return PyFloat_FromDouble(now_ms()); }

static PyMethodDef methods[] = {
    {"init_cuda", init_cuda, METH_VARARGS, "Resolve the CUDA runtime's event functions from the library at path."},
    {"run_loop", (PyCFunction)(void (*)(void))run_loop, METH_VARARGS | METH_KEYWORDS,
     "Time calls[j % len(calls)]() for j in range(n); see the module source."},
    {"host_ms", host_ms, METH_NOARGS, "CLOCK_MONOTONIC in milliseconds."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cuda_agent_timing", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cuda_agent_timing(void) { return PyModule_Create(&module); }
