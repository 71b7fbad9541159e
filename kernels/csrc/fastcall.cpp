// One-call repeats of a recorded eager call (issue 55; docs/notes/host_path.md).
//
// A *plan* is built once per call signature from the Python path's recorded launch list
// (kernels/fastcall.py, make_plan). It holds what the signature fixes: the metadata each
// argument must have (type, sizes, strides, dtype, device; None; or an option object: the
// recorded one, or one of its exact type that compares equal), the outputs to allocate
// (sizes, strides, dtype, device) or alias, the workspace size, and per launch the
// CUfunction, grid, block, shared memory, the PDL / cooperative flags and a prebuilt
// parameter buffer with slots for this call's addresses.
//
// run(plan, *args): checks every argument against the plan (no Python object is built),
// allocates the outputs and the workspace, checks the 16-byte alignment the recorded
// specialisation assumed, writes the addresses into the buffers, launches (cuLaunchKernelEx,
// resolved from libcuda at load time), returns the outputs. Anything that does not match
// returns None *before* anything is launched: the Python path (the recorder, full checks,
// the same errors) then takes the call.
//
// GDN_FASTCALL_STUB (a CPU build, for CI): everything but the launch; each launch is noted
// (function handle, grid, block, shared memory, flags, each parameter's bytes) for
// stub_last(plan).
#include <Python.h>

#include <ATen/EmptyTensor.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef GDN_FASTCALL_STUB
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <dlfcn.h>
typedef CUresult (*launch_ex_t)(const CUlaunchConfig*, CUfunction, void**, void**);
typedef CUresult (*error_string_t)(CUresult, const char**);
static launch_ex_t g_launch = nullptr;
static error_string_t g_error_string = nullptr;
#endif

namespace {

constexpr int kMaxDim = 8;

struct Meta {                       // a tensor argument's (or output's) metadata
  PyTypeObject* type = nullptr;
  int ndim = 0;
  int64_t sizes[kMaxDim] = {0};
  int64_t strides[kMaxDim] = {0};
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

enum ArgKind { ARG_NONE = 0, ARG_TENSOR = 1, ARG_IS = 2 };

struct Arg {
  int kind = ARG_NONE;
  Meta meta;
  PyObject* obj = nullptr;          // ARG_IS: the recorded option (a strong reference)
};

struct Out {                         // a derived source: an alias or a fresh tensor
  int alias = -1;                    // source index, or -1: allocate
  Meta meta;
};

struct Fill {                        // a parameter slot: the buffer offset, what goes there
  int64_t at;
  int source;                        // source index; -1: the workspace
  int64_t offset;                    // bytes added to the address
};

struct Launch {
  uint64_t function = 0;
  unsigned grid[3] = {1, 1, 1};
  unsigned block = 32;
  unsigned shared = 0;
  int pdl = 0, coop = 0;
  std::vector<uint64_t> arena;       // the parameters' bytes, 8-byte aligned each
  std::vector<int64_t> offsets;      // each parameter's byte offset into the arena
  std::vector<int> sizes;            // each parameter's size in bytes
  std::vector<void*> params;         // pointers into the arena (cuLaunchKernelEx's kernelParams)
  std::vector<Fill> fills;
};

struct Plan {
  std::vector<Arg> args;
  std::vector<Out> outs;             // sources args.size() .. args.size() + outs.size() - 1
  int64_t ws_bytes = 0;              // 0: no workspace
  c10::Device ws_device = c10::Device(c10::DeviceType::CPU);
  std::vector<int> aligned;          // sources whose address must be 16-byte aligned
  bool ws_aligned = false;
  std::vector<int> returns;          // sources returned, in order
  std::vector<Launch> launches;
  int device = -1;                   // the current CUDA device recorded (-1: stub)
  PyObject* last = nullptr;          // stub: (launch notes, sources, workspace) of the last run
};

PyObject* g_runtime = nullptr;       // triton.knobs.runtime (its launch hooks), or NULL

const char* kCapsule = "gdn_fastcall.Plan";

void plan_free(PyObject* cap) {
  auto* p = static_cast<Plan*>(PyCapsule_GetPointer(cap, kCapsule));
  if (!p) return;
  for (auto& a : p->args) Py_XDECREF(a.obj);
  Py_XDECREF(p->last);
  delete p;
}

bool meta_from(const at::Tensor& t, PyTypeObject* type, Meta& m) {
  if (t.layout() != c10::kStrided || t.dim() > kMaxDim) return false;
  m.type = type;
  m.ndim = static_cast<int>(t.dim());
  for (int d = 0; d < m.ndim; ++d) {
    m.sizes[d] = t.sizes()[d];
    m.strides[d] = t.strides()[d];
  }
  m.dtype = t.scalar_type();
  m.device = t.device();
  return true;
}

// Whether the tensor object `o` has exactly the metadata `m` (type, layout, dims, sizes,
// strides, dtype, device).
inline bool meta_match(PyObject* o, const Meta& m) {
  if (Py_TYPE(o) != m.type) return false;
  const at::Tensor& t = THPVariable_Unpack(o);
  if (t.layout() != c10::kStrided || t.dim() != m.ndim) return false;
  if (t.scalar_type() != m.dtype || t.device() != m.device) return false;
  auto sz = t.sizes();
  auto st = t.strides();
  for (int d = 0; d < m.ndim; ++d)
    if (sz[d] != m.sizes[d] || st[d] != m.strides[d]) return false;
  return true;
}

// No Triton launch hook set (a profiler's): None, or a HookChain whose `calls` is empty.
bool hook_clear(const char* name) {
  if (!g_runtime) return true;
  PyObject* h = PyObject_GetAttrString(g_runtime, name);
  if (!h) { PyErr_Clear(); return false; }
  bool ok = h == Py_None;
  if (!ok) {
    PyObject* calls = PyObject_GetAttrString(h, "calls");
    if (!calls) PyErr_Clear();
    else {
      ok = PyList_Check(calls) && PyList_GET_SIZE(calls) == 0;
      Py_DECREF(calls);
    }
  }
  Py_DECREF(h);
  return ok;
}

bool fast_launch_off() {
  const char* e = std::getenv("GDN_FAST_LAUNCH");
  return e && std::strcmp(e, "0") == 0;
}

at::Tensor empty(const Meta& m) {
  c10::IntArrayRef sizes(m.sizes, m.ndim), strides(m.strides, m.ndim);
#ifndef GDN_FASTCALL_STUB
  if (m.device.is_cuda())
    return at::detail::empty_strided_cuda(sizes, strides, m.dtype, m.device);
#endif
  return at::detail::empty_strided_cpu(sizes, strides, m.dtype);
}

int64_t as_i64(PyObject* o) { return PyLong_AsLongLong(o); }

// --- make_plan --------------------------------------------------------------------------------

// make_plan(args, outs, workspace, aligned, returns, launches, device)
//   args: per argument ("none",) | ("tensor", t) | ("is", obj)
//   outs: per derived source ("alias", i) | ("empty", t)
//   workspace: None | t (a recorded workspace: its bytes and device)
//   aligned: source indices that must be 16-byte aligned (-1: the workspace)
//   returns: source indices returned
//   launches: per launch (function, (gx, gy, gz), block, shared, pdl, coop, params)
//       params: per parameter (size, bytes) | (size, source, offset) (source -1: workspace)
PyObject* make_plan(PyObject*, PyObject* a) {
  PyObject *args, *outs, *ws, *aligned, *returns, *launches;
  int device;
  if (!PyArg_ParseTuple(a, "O!O!OO!O!O!i", &PyTuple_Type, &args, &PyTuple_Type, &outs, &ws,
                        &PyTuple_Type, &aligned, &PyTuple_Type, &returns, &PyTuple_Type,
                        &launches, &device))
    return nullptr;
  auto* p = new Plan();
  PyObject* cap = PyCapsule_New(p, kCapsule, plan_free);
  if (!cap) { delete p; return nullptr; }
  p->device = device;
  auto fail = [&](const char* msg) -> PyObject* {
    PyErr_SetString(PyExc_ValueError, msg);
    Py_DECREF(cap);
    return nullptr;
  };
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); ++i) {
    PyObject* e = PyTuple_GET_ITEM(args, i);
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) < 1) return fail("args: tuples");
    const char* kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(e, 0));
    if (!kind) { Py_DECREF(cap); return nullptr; }
    Arg arg;
    if (!std::strcmp(kind, "none")) {
      arg.kind = ARG_NONE;
    } else if (!std::strcmp(kind, "tensor") && PyTuple_GET_SIZE(e) == 2 &&
               THPVariable_Check(PyTuple_GET_ITEM(e, 1))) {
      PyObject* t = PyTuple_GET_ITEM(e, 1);
      arg.kind = ARG_TENSOR;
      if (!meta_from(THPVariable_Unpack(t), Py_TYPE(t), arg.meta))
        return fail("args: a tensor that is not strided or has too many dims");
    } else if (!std::strcmp(kind, "is") && PyTuple_GET_SIZE(e) == 2) {
      arg.kind = ARG_IS;
      arg.obj = PyTuple_GET_ITEM(e, 1);
      Py_INCREF(arg.obj);
    } else {
      return fail("args: ('none',), ('tensor', t) or ('is', obj)");
    }
    p->args.push_back(arg);
  }
  int n_src = static_cast<int>(p->args.size() + PyTuple_GET_SIZE(outs));
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(outs); ++i) {
    PyObject* e = PyTuple_GET_ITEM(outs, i);
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2) return fail("outs: pairs");
    const char* kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(e, 0));
    if (!kind) { Py_DECREF(cap); return nullptr; }
    Out o;
    if (!std::strcmp(kind, "alias")) {
      o.alias = static_cast<int>(as_i64(PyTuple_GET_ITEM(e, 1)));
      if (o.alias < 0 || o.alias >= static_cast<int>(p->args.size() + i))
        return fail("outs: an alias names an earlier source");
    } else if (!std::strcmp(kind, "empty") && THPVariable_Check(PyTuple_GET_ITEM(e, 1))) {
      if (!meta_from(THPVariable_Unpack(PyTuple_GET_ITEM(e, 1)), nullptr, o.meta))
        return fail("outs: not a strided tensor");
    } else {
      return fail("outs: ('alias', i) or ('empty', t)");
    }
    p->outs.push_back(o);
  }
  if (ws != Py_None) {
    if (!THPVariable_Check(ws)) return fail("workspace: a tensor or None");
    const at::Tensor& t = THPVariable_Unpack(ws);
    p->ws_bytes = static_cast<int64_t>(t.nbytes());
    p->ws_device = t.device();
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(aligned); ++i) {
    int s = static_cast<int>(as_i64(PyTuple_GET_ITEM(aligned, i)));
    if (s == -1) p->ws_aligned = true;
    else if (s < 0 || s >= n_src) return fail("aligned: a source index");
    else p->aligned.push_back(s);
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(returns); ++i) {
    int s = static_cast<int>(as_i64(PyTuple_GET_ITEM(returns, i)));
    if (s < 0 || s >= n_src) return fail("returns: a source index");
    p->returns.push_back(s);
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(launches); ++i) {
    PyObject* e = PyTuple_GET_ITEM(launches, i);
    unsigned long long fn;
    unsigned gx, gy, gz, block, shared;
    int pdl, coop;
    PyObject* params;
    if (!PyArg_ParseTuple(e, "K(III)IIppO!", &fn, &gx, &gy, &gz, &block, &shared, &pdl,
                          &coop, &PyTuple_Type, &params)) {
      Py_DECREF(cap);
      return nullptr;
    }
    Launch L;
    L.function = fn;
    L.grid[0] = gx; L.grid[1] = gy; L.grid[2] = gz;
    L.block = block; L.shared = shared; L.pdl = pdl; L.coop = coop;
    int64_t words = 0;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(params); ++j) {
      PyObject* q = PyTuple_GET_ITEM(params, j);
      int size = static_cast<int>(as_i64(PyTuple_GET_ITEM(q, 0)));
      if (size < 1 || size > 8) return fail("params: size 1..8");
      L.offsets.push_back(words * 8);
      L.sizes.push_back(size);
      words += 1;
    }
    L.arena.assign(words, 0);
    char* base = reinterpret_cast<char*>(L.arena.data());
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(params); ++j) {
      PyObject* q = PyTuple_GET_ITEM(params, j);
      int64_t at = L.offsets[j];
      if (PyTuple_GET_SIZE(q) == 2) {       // constant bytes
        char* b;
        Py_ssize_t n;
        if (PyBytes_AsStringAndSize(PyTuple_GET_ITEM(q, 1), &b, &n) < 0) {
          Py_DECREF(cap);
          return nullptr;
        }
        if (n != L.sizes[j]) return fail("params: bytes of the parameter's size");
        std::memcpy(base + at, b, n);
      } else if (PyTuple_GET_SIZE(q) == 3) {  // an address slot
        int s = static_cast<int>(as_i64(PyTuple_GET_ITEM(q, 1)));
        if (L.sizes[j] != 8 || s < -1 || s >= n_src) return fail("params: a pointer slot");
        if (s == -1 && ws == Py_None) return fail("params: a workspace slot, no workspace");
        L.fills.push_back({at, s, as_i64(PyTuple_GET_ITEM(q, 2))});
      } else {
        return fail("params: (size, bytes) or (size, source, offset)");
      }
    }
    for (int64_t off : L.offsets) L.params.push_back(base + off);
    p->launches.push_back(std::move(L));
  }
  if (PyErr_Occurred()) { Py_DECREF(cap); return nullptr; }
  return cap;
}

// --- run --------------------------------------------------------------------------------------

#ifdef GDN_FASTCALL_STUB
PyObject* note_launch(const Launch& L) {
  PyObject* params = PyTuple_New(static_cast<Py_ssize_t>(L.params.size()));
  for (size_t j = 0; j < L.params.size(); ++j)
    PyTuple_SET_ITEM(params, j, PyBytes_FromStringAndSize(
                                    static_cast<const char*>(L.params[j]), L.sizes[j]));
  return Py_BuildValue("{s:K,s:(III),s:I,s:I,s:O,s:O,s:N}", "function",
                       (unsigned long long)L.function, "grid", L.grid[0], L.grid[1],
                       L.grid[2], "block", L.block, "shared", L.shared, "pdl",
                       L.pdl ? Py_True : Py_False, "coop", L.coop ? Py_True : Py_False,
                       "params", params);
}
#endif

PyObject* run(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc < 1) {
    PyErr_SetString(PyExc_TypeError, "run(plan, *args)");
    return nullptr;
  }
  auto* p = static_cast<Plan*>(PyCapsule_GetPointer(argv[0], kCapsule));
  if (!p) return nullptr;
  const int n_args = static_cast<int>(p->args.size());
  if (argc - 1 != n_args || fast_launch_off()) Py_RETURN_NONE;
  // 1. every argument as recorded
  for (int i = 0; i < n_args; ++i) {
    PyObject* o = argv[1 + i];
    const Arg& a = p->args[i];
    if (a.kind == ARG_NONE) {
      if (o != Py_None) Py_RETURN_NONE;
    } else if (a.kind == ARG_IS) {
      // the recorded object, or an equal one of its exact type: the Python path keys its
      // signatures on the value too (a config or scale built per call; True is not 1)
      if (o != a.obj) {
        if (Py_TYPE(o) != Py_TYPE(a.obj)) Py_RETURN_NONE;
        int eq = PyObject_RichCompareBool(o, a.obj, Py_EQ);
        if (eq < 0) PyErr_Clear();
        if (eq != 1) Py_RETURN_NONE;
      }
    } else if (!THPVariable_Check(o) || !meta_match(o, a.meta)) {
      Py_RETURN_NONE;
    }
  }
  if (!hook_clear("launch_enter_hook") || !hook_clear("launch_exit_hook")) Py_RETURN_NONE;
#ifndef GDN_FASTCALL_STUB
  if (c10::cuda::current_device() != p->device) Py_RETURN_NONE;
#endif
  // 2. the sources' addresses; the outputs and the workspace allocated
  const int n_src = n_args + static_cast<int>(p->outs.size());
  std::vector<uintptr_t> ptr(n_src, 0);
  std::vector<at::Tensor> made(p->outs.size());
  for (int i = 0; i < n_args; ++i)
    if (p->args[i].kind == ARG_TENSOR)
      ptr[i] = reinterpret_cast<uintptr_t>(THPVariable_Unpack(argv[1 + i]).data_ptr());
  for (size_t j = 0; j < p->outs.size(); ++j) {
    const Out& o = p->outs[j];
    if (o.alias >= 0) {
      ptr[n_args + j] = ptr[o.alias];
    } else {
      made[j] = empty(o.meta);
      ptr[n_args + j] = reinterpret_cast<uintptr_t>(made[j].data_ptr());
    }
  }
  at::Tensor ws;
  uintptr_t ws_ptr = 0;
  if (p->ws_bytes) {
    Meta m;
    m.ndim = 1;
    m.sizes[0] = p->ws_bytes;
    m.strides[0] = 1;
    m.dtype = c10::ScalarType::Byte;
    m.device = p->ws_device;
    ws = empty(m);
    ws_ptr = reinterpret_cast<uintptr_t>(ws.data_ptr());
  }
  // 3. the alignment the recorded specialisation assumed
  uintptr_t mis = p->ws_aligned ? ws_ptr : 0;
  for (int s : p->aligned) mis |= ptr[s];
  if (mis & 15) Py_RETURN_NONE;
  // 4. the launches
#ifdef GDN_FASTCALL_STUB
  PyObject* notes = PyList_New(0);
#else
  CUstream stream = reinterpret_cast<CUstream>(
      c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(p->device)).stream());
#endif
  for (size_t n = 0; n < p->launches.size(); ++n) {
    Launch& L = p->launches[n];
    char* base = reinterpret_cast<char*>(L.arena.data());
    for (const Fill& f : L.fills) {
      uint64_t v = (f.source >= 0 ? ptr[f.source] : ws_ptr) + f.offset;
      std::memcpy(base + f.at, &v, 8);
    }
#ifdef GDN_FASTCALL_STUB
    PyObject* note = note_launch(L);
    PyList_Append(notes, note);
    Py_DECREF(note);
#else
    if (L.grid[0] * L.grid[1] * L.grid[2] == 0) continue;
    CUlaunchAttribute attrs[2];
    int n_attrs = 0;
    if (L.pdl) {
      attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attrs[n_attrs].value.programmaticStreamSerializationAllowed = 1;
      ++n_attrs;
    }
    if (L.coop) {
      attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attrs[n_attrs].value.cooperative = 1;
      ++n_attrs;
    }
    CUlaunchConfig cfg;
    std::memset(&cfg, 0, sizeof(cfg));
    cfg.gridDimX = L.grid[0];
    cfg.gridDimY = L.grid[1];
    cfg.gridDimZ = L.grid[2];
    cfg.blockDimX = L.block;
    cfg.blockDimY = 1;
    cfg.blockDimZ = 1;
    cfg.sharedMemBytes = L.shared;
    cfg.hStream = stream;
    cfg.attrs = attrs;
    cfg.numAttrs = n_attrs;
    CUresult r = g_launch(&cfg, reinterpret_cast<CUfunction>(L.function), L.params.data(),
                          nullptr);
    if (r != CUDA_SUCCESS) {
      const char* msg = nullptr;
      if (g_error_string) g_error_string(r, &msg);
      PyErr_Format(PyExc_RuntimeError, "Triton Error [CUDA]: %s (launch %d of a fastcall plan)",
                   msg ? msg : "unknown error", static_cast<int>(n));
      return nullptr;
    }
#endif
  }
  // 5. the outputs
  PyObject* res = PyTuple_New(static_cast<Py_ssize_t>(p->returns.size()));
  if (!res) return nullptr;
  std::vector<PyObject*> wrapped(n_src, nullptr);
  auto source = [&](int s) -> PyObject* {
    while (s >= n_args && p->outs[s - n_args].alias >= 0) s = p->outs[s - n_args].alias;
    if (s < n_args) { Py_INCREF(argv[1 + s]); return argv[1 + s]; }
    if (!wrapped[s]) wrapped[s] = THPVariable_Wrap(made[s - n_args]);
    Py_XINCREF(wrapped[s]);
    return wrapped[s];
  };
  for (size_t r = 0; r < p->returns.size(); ++r) {
    PyObject* o = source(p->returns[r]);
    if (!o) { Py_DECREF(res); res = nullptr; break; }
    PyTuple_SET_ITEM(res, r, o);
  }
#ifdef GDN_FASTCALL_STUB
  if (res) {   // (launch notes, every source, the workspace) for stub_last
    PyObject* srcs = PyTuple_New(n_src);
    for (int s = 0; s < n_src; ++s) {
      PyObject* o = (s < n_args && p->args[s].kind != ARG_TENSOR) ? (Py_INCREF(Py_None), Py_None)
                                                                  : source(s);
      PyTuple_SET_ITEM(srcs, s, o);
    }
    PyObject* w = ws.defined() ? THPVariable_Wrap(ws) : (Py_INCREF(Py_None), Py_None);
    Py_XDECREF(p->last);
    p->last = Py_BuildValue("(NNN)", notes, srcs, w);
  } else {
    Py_DECREF(notes);
  }
#endif
  for (PyObject* w : wrapped) Py_XDECREF(w);
  return res;
}

PyObject* stub_last(PyObject*, PyObject* cap) {
  auto* p = static_cast<Plan*>(PyCapsule_GetPointer(cap, kCapsule));
  if (!p) return nullptr;
  PyObject* r = p->last ? p->last : Py_None;
  Py_INCREF(r);
  return r;
}

PyObject* set_runtime(PyObject*, PyObject* rt) {
  Py_XDECREF(g_runtime);
  g_runtime = rt == Py_None ? nullptr : rt;
  Py_XINCREF(g_runtime);
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"make_plan", (PyCFunction)make_plan, METH_VARARGS, "a plan from a recorded call"},
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
     "run(plan, *args): the outputs, or None (nothing launched) where the plan does not "
     "stand for this call"},
    {"stub_last", (PyCFunction)stub_last, METH_O, "stub build: the last run's notes"},
    {"set_runtime", (PyCFunction)set_runtime, METH_O, "triton.knobs.runtime (launch hooks)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gdn_fastcall", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__gdn_fastcall() {
#ifndef GDN_FASTCALL_STUB
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    PyErr_Format(PyExc_ImportError, "gdn fastcall: cannot load libcuda.so.1 (%s)", dlerror());
    return nullptr;
  }
  g_launch = reinterpret_cast<launch_ex_t>(dlsym(lib, "cuLaunchKernelEx"));
  g_error_string = reinterpret_cast<error_string_t>(dlsym(lib, "cuGetErrorString"));
  if (!g_launch) {
    PyErr_SetString(PyExc_ImportError, "gdn fastcall: libcuda has no cuLaunchKernelEx");
    return nullptr;
  }
#endif
  PyObject* m = PyModule_Create(&module);
  if (m) PyModule_AddIntConstant(m, "STUB",
#ifdef GDN_FASTCALL_STUB
                                 1
#else
                                 0
#endif
  );
  return m;
}
