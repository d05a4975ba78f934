/* The abort callback llama.cpp calls between the nodes of a step's compute graph (hundreds of times a step).
 *
 * It only reads a flag that another thread sets. Written in C because a Python callback would need the
 * interpreter lock at every call: while any Python thread is busy, each call waits for the lock and a step
 * takes several times longer. The module itself is empty; `abort_flag.py` loads this function with ctypes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>

bool tokenrelay_abort_requested(void *flag) {
    return __atomic_load_n((const int *)flag, __ATOMIC_RELAXED) != 0;
}

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_abort_flag", "llama.cpp's abort callback, read by ctypes (see abort_flag.py)", -1, NULL,
};

PyMODINIT_FUNC PyInit__abort_flag(void) { return PyModule_Create(&module); }
