# The C extension built from abort_flag.c: an empty module whose library exports
# `bool tokenrelay_abort_requested(void *flag)`, which abort_flag.py hands to llama.cpp through ctypes.
