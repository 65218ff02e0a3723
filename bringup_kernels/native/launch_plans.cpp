// bringup_kernels._launch_plans: an op call served from a recorded launch plan, without Python.
//
// A Table stands in front of one op's Python function. A call's key is everything about its
// arguments that a wrapper may branch on: per tensor its dtype, device, sizes, strides, the low 4
// bits of its address and which earlier tensor argument (if any) starts at the same address (so a
// plan recorded in place serves only calls in place); per scalar (None, bool, int, float, str,
// torch.dtype) its type and value; the keyword names; and the current CUDA device. A key with a
// plan is replayed here: the plan's fresh buffers are allocated (the caching allocator, as
// torch.empty), every kernel is launched with cuLaunchKernelEx on the current stream with its
// recorded parameters, pointers rebased onto this call's tensors and buffers (TMA descriptors
// encoded again for the new addresses), and the outputs are rebuilt as views of those tensors and
// buffers. Any other call (no plan, an argument outside the key's types, a stream being captured)
// goes to the Python fallback with the key (or None), which may record a plan and add() it.
// bringup_kernels/launch_plans.py builds the plans; what a plan holds is described there.
#include <ATen/ATen.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <cuda.h>  // types only (Triton's copy); the driver's functions are looked up at run time
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int64_t API_VERSION = 2;
constexpr size_t MAX_PLANS = 512;  // per table: past it, new keys take the fallback for good

// ---- the CUDA driver, looked up once -----------------------------------------------------------
struct Driver {
  decltype(&cuLaunchKernelEx) launch = nullptr;
  decltype(&cuTensorMapEncodeTiled) encode = nullptr;
  decltype(&cuGetErrorString) error_string = nullptr;
  decltype(&cuStreamIsCapturing) is_capturing = nullptr;
  std::string missing;

  Driver() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      missing = "libcuda.so.1 does not load";
      return;
    }
    launch = reinterpret_cast<decltype(launch)>(dlsym(lib, "cuLaunchKernelEx"));
    encode = reinterpret_cast<decltype(encode)>(dlsym(lib, "cuTensorMapEncodeTiled"));
    error_string = reinterpret_cast<decltype(error_string)>(dlsym(lib, "cuGetErrorString"));
    is_capturing = reinterpret_cast<decltype(is_capturing)>(dlsym(lib, "cuStreamIsCapturing"));
    if (!launch || !encode || !error_string || !is_capturing) missing = "libcuda.so.1 lacks a function";
  }
};

const Driver& driver() {
  static Driver d;
  if (!d.missing.empty()) throw std::runtime_error("bringup_kernels._launch_plans: " + d.missing);
  return d;
}

void check_cuda(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  const char* text = nullptr;
  driver().error_string(result, &text);
  throw std::runtime_error(std::string("bringup_kernels._launch_plans: ") + what + ": " +
                           (text ? text : "unknown error"));
}

// ---- the key -----------------------------------------------------------------------------------
template <typename T>
void put(std::string& key, T value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// Appends `value` to `key` (tensors also to `tensors`); false for a type the key does not hold.
bool append(std::string& key, PyObject* value, std::vector<at::Tensor>& tensors) {
  if (THPVariable_Check(value)) {
    const at::Tensor& t = THPVariable_Unpack(value);
    if (!t.has_storage()) return false;  // no address to rebase onto
    key.push_back('T');
    put<int8_t>(key, static_cast<int8_t>(t.scalar_type()));
    put<int8_t>(key, static_cast<int8_t>(t.device().type()));
    put<int8_t>(key, t.device().index());
    put<int8_t>(key, static_cast<int8_t>(t.dim()));
    for (int64_t s : t.sizes()) put(key, s);
    for (int64_t s : t.strides()) put(key, s);
    put<uint8_t>(key, static_cast<uint8_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) & 15));
    int16_t same_start = -1;
    for (size_t i = 0; i < tensors.size() && same_start < 0; ++i)
      if (tensors[i].data_ptr() == t.data_ptr()) same_start = static_cast<int16_t>(i);
    put(key, same_start);
    tensors.push_back(t);
    return true;
  }
  if (value == Py_None) {
    key.push_back('N');
    return true;
  }
  if (PyBool_Check(value)) {
    key.push_back(value == Py_True ? 'B' : 'b');
    return true;
  }
  if (PyLong_CheckExact(value)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow) return false;
    key.push_back('i');
    put(key, static_cast<int64_t>(v));
    return true;
  }
  if (PyFloat_CheckExact(value)) {
    key.push_back('f');
    put(key, PyFloat_AS_DOUBLE(value));
    return true;
  }
  if (PyUnicode_CheckExact(value)) {
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(value, &size);
    if (!text) {
      PyErr_Clear();
      return false;
    }
    key.push_back('s');
    put(key, static_cast<int64_t>(size));
    key.append(text, size);
    return true;
  }
  if (THPDtype_Check(value)) {
    key.push_back('d');
    put<int8_t>(key, static_cast<int8_t>(reinterpret_cast<THPDtype*>(value)->scalar_type));
    return true;
  }
  return false;
}

// ---- a plan ------------------------------------------------------------------------------------
enum Source : int { NONE = 0, INPUT = 1, BUFFER = 2, FIXED = 3 };

struct Ref {  // an address: a source's base (an input's data pointer, a buffer's) plus an offset
  int source = NONE;
  int64_t index = 0;
  int64_t offset = 0;  // bytes; the address itself for FIXED
};

struct Tma {  // a CUtensorMap to encode at `at` in the parameter block
  size_t at = 0;
  Ref base;
  int dtype = 0, rank = 0, swizzle = 0, fill = 0;
  cuuint64_t dims[5] = {}, strides[5] = {};
  cuuint32_t box[5] = {}, element_strides[5] = {1, 1, 1, 1, 1};
};

struct Launch {
  py::object keep;  // the compiled kernel: its module stays loaded
  CUfunction function = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned threads = 0, shared = 0, ctas = 1;
  bool pdl = false, cooperative = false;
  std::vector<uint8_t> block;            // the parameters' template, each at its offset
  std::vector<size_t> offsets;           // one per kernel parameter
  std::vector<std::pair<size_t, Ref>> pointers;
  std::vector<Tma> maps;
};

struct Output {
  Ref ref;
  at::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
};

struct Plan {
  std::vector<std::pair<int64_t, int8_t>> buffers;  // bytes, CUDA device (-1: CPU)
  std::vector<Launch> launches;
  std::vector<Output> outputs;
  bool tuple = false;
  py::object keep;  // what FIXED addresses point into
};

int64_t as_int(py::handle h) { return py::cast<int64_t>(h); }

// `h` as a sequence (a tuple or a list, as launch_plans.py builds them); TypeError otherwise.
py::sequence items(py::handle h) {
  if (!PySequence_Check(h.ptr()))
    throw py::type_error("bringup_kernels._launch_plans: a plan's part is not a sequence");
  return py::reinterpret_borrow<py::sequence>(h);
}

Ref parse_ref(py::handle h) {
  py::sequence t = items(h);
  return Ref{static_cast<int>(as_int(t[0])), as_int(t[1]), as_int(t[2])};
}

template <typename T>
void fill(T* out, py::handle list, size_t limit) {
  py::sequence values = items(list);
  if (values.size() > limit) throw py::value_error("bringup_kernels._launch_plans: a TMA descriptor of rank > 5");
  for (size_t i = 0; i < values.size(); ++i) out[i] = static_cast<T>(py::cast<uint64_t>(values[i]));
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// One launch from (kernel, function, grid, threads, ctas, shared, pdl, cooperative, params);
// a param is ("raw", bytes, alignment), ("ptr", ref) or ("tma", ref, dtype, dims, strides, box,
// swizzle, fill) with the dims, strides (bytes, one fewer) and box innermost first.
Launch parse_launch(py::handle h) {
  py::sequence t = items(h);
  Launch l;
  l.keep = py::reinterpret_borrow<py::object>(t[0]);
  l.function = reinterpret_cast<CUfunction>(static_cast<uintptr_t>(py::cast<uint64_t>(t[1])));
  py::sequence grid = items(t[2]);
  for (size_t i = 0; i < 3; ++i) l.grid[i] = py::cast<unsigned>(grid[i]);
  l.threads = py::cast<unsigned>(t[3]);
  l.ctas = py::cast<unsigned>(t[4]);
  l.shared = py::cast<unsigned>(t[5]);
  l.pdl = py::cast<bool>(t[6]);
  l.cooperative = py::cast<bool>(t[7]);
  size_t size = 0;
  std::vector<std::pair<size_t, std::string>> raw;
  for (py::handle p : items(t[8])) {
    py::sequence param = items(p);
    std::string kind = py::cast<std::string>(param[0]);
    if (kind == "raw") {
      std::string bytes = py::cast<std::string>(param[1]);
      size = align_up(size, py::cast<size_t>(param[2]));
      l.offsets.push_back(size);
      raw.emplace_back(size, bytes);
      size += bytes.size();
    } else if (kind == "ptr") {
      size = align_up(size, 8);
      l.offsets.push_back(size);
      l.pointers.emplace_back(size, parse_ref(param[1]));
      size += 8;
    } else if (kind == "tma") {
      size = align_up(size, 64);
      l.offsets.push_back(size);
      Tma m;
      m.at = size;
      m.base = parse_ref(param[1]);
      m.dtype = py::cast<int>(param[2]);
      m.rank = static_cast<int>(py::len(param[3]));
      fill(m.dims, param[3], 5);
      fill(m.strides, param[4], 5);
      fill(m.box, param[5], 5);
      m.swizzle = py::cast<int>(param[6]);
      m.fill = py::cast<int>(param[7]);
      l.maps.push_back(m);
      size += sizeof(CUtensorMap);
    } else {
      throw py::value_error("bringup_kernels._launch_plans: unknown parameter kind " + kind);
    }
  }
  l.block.assign(size, 0);
  for (auto& [at, bytes] : raw) std::memcpy(l.block.data() + at, bytes.data(), bytes.size());
  return l;
}

// A plan from (buffers, launches, outputs, tuple, keep): buffers as (bytes, device), outputs as
// (ref, dtype, sizes, strides).
Plan parse_plan(py::handle h) {
  py::sequence t = items(h);
  Plan plan;
  for (py::handle b : items(t[0])) {
    py::sequence bt = items(b);
    plan.buffers.emplace_back(as_int(bt[0]), static_cast<int8_t>(as_int(bt[1])));
  }
  for (py::handle l : items(t[1])) plan.launches.push_back(parse_launch(l));
  for (py::handle o : items(t[2])) {
    py::sequence ot = items(o);
    if (!THPDtype_Check(ot[1].ptr()))
      throw py::value_error("bringup_kernels._launch_plans: an output's dtype is not a torch.dtype");
    Output out{parse_ref(ot[0]), reinterpret_cast<THPDtype*>(ot[1].ptr())->scalar_type,
               py::cast<std::vector<int64_t>>(ot[2]), py::cast<std::vector<int64_t>>(ot[3])};
    plan.outputs.push_back(std::move(out));
  }
  plan.tuple = py::cast<bool>(t[3]);
  plan.keep = py::reinterpret_borrow<py::object>(t[4]);
  return plan;
}

// ---- the table ---------------------------------------------------------------------------------
class Table {
 public:
  Table(py::object fallback, py::object current_device, py::object current_stream)
      : fallback_(std::move(fallback)), device_(std::move(current_device)), stream_(std::move(current_stream)) {}

  py::object call(py::args args, py::kwargs kwargs) {
    std::vector<at::Tensor> tensors;
    int64_t device = -1;
    std::optional<std::string> key = make_key(args, kwargs, tensors, device);
    if (key) {
      auto found = plans_.find(*key);
      if (found != plans_.end()) {
        if (auto out = replay(found->second, tensors, device)) {
          ++hits_;
          return *out;
        }
      }
    }
    ++misses_;
    return fallback_(key ? py::object(py::bytes(*key)) : py::none(), args, kwargs);
  }

  py::object key(py::args args, py::kwargs kwargs) {
    std::vector<at::Tensor> tensors;
    int64_t device = -1;
    auto k = make_key(args, kwargs, tensors, device);
    return k ? py::object(py::bytes(*k)) : py::none();
  }

  bool add(const py::bytes& key, py::handle plan) {
    if (plans_.size() >= MAX_PLANS) return false;
    plans_.insert_or_assign(std::string(key), parse_plan(plan));
    return true;
  }

  void clear() { plans_.clear(); }
  size_t size() const { return plans_.size(); }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  // The call's key (the module doc) or nullopt; its tensors and the current CUDA device (-1: none).
  std::optional<std::string> make_key(const py::args& args, const py::kwargs& kwargs, std::vector<at::Tensor>& tensors,
                                      int64_t& device) {
    std::string key;
    key.reserve(256);
    device = device_.is_none() ? -1 : as_int(device_());
    put(key, device);
    for (py::handle a : args)
      if (!append(key, a.ptr(), tensors)) return std::nullopt;
    for (auto [name, value] : kwargs) {
      key.push_back('k');
      if (!append(key, name.ptr(), tensors) || !append(key, value.ptr(), tensors)) return std::nullopt;
    }
    return key;
  }

  static uint64_t address(const Ref& r, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& buffers) {
    switch (r.source) {
      case INPUT: return reinterpret_cast<uintptr_t>(inputs[r.index].data_ptr()) + r.offset;
      case BUFFER: return reinterpret_cast<uintptr_t>(buffers[r.index].data_ptr()) + r.offset;
      case FIXED: return static_cast<uint64_t>(r.offset);
      default: return 0;
    }
  }

  // The plan run for this call; nullopt (the fallback serves it) while the stream is captured.
  std::optional<py::object> replay(Plan& plan, const std::vector<at::Tensor>& inputs, int64_t device) {
    CUstream stream = nullptr;
    if (!plan.launches.empty()) {
      stream = reinterpret_cast<CUstream>(static_cast<uintptr_t>(py::cast<uint64_t>(stream_(device))));
      CUstreamCaptureStatus status;
      check_cuda(driver().is_capturing(stream, &status), "cuStreamIsCapturing");
      if (status != CU_STREAM_CAPTURE_STATUS_NONE) return std::nullopt;
    }
    std::vector<at::Tensor> buffers;
    buffers.reserve(plan.buffers.size());
    for (auto [bytes, on] : plan.buffers) {
      auto options = at::TensorOptions().dtype(at::kByte);
      options = on < 0 ? options.device(at::kCPU) : options.device(at::Device(at::kCUDA, on));
      buffers.push_back(at::empty({bytes}, options));
    }
    for (Launch& l : plan.launches) launch(l, stream, inputs, buffers);
    py::tuple result(plan.outputs.size());
    for (size_t i = 0; i < plan.outputs.size(); ++i) result[i] = view(plan.outputs[i], inputs, buffers);
    if (!plan.tuple) return py::object(result[0]);
    return py::object(result);
  }

  static void launch(Launch& l, CUstream stream, const std::vector<at::Tensor>& inputs,
                     const std::vector<at::Tensor>& buffers) {
    std::vector<uint8_t> scratch(l.block.size() + 64);  // the parameters of this launch, 64-byte aligned (TMA)
    uint8_t* block = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(scratch.data()), 64));
    std::memcpy(block, l.block.data(), l.block.size());
    for (auto& [at, ref] : l.pointers) {
      uint64_t value = address(ref, inputs, buffers);
      std::memcpy(block + at, &value, 8);
    }
    for (Tma& m : l.maps) {
      void* base = reinterpret_cast<void*>(address(m.base, inputs, buffers));
      CUresult encoded = driver().encode(
          reinterpret_cast<CUtensorMap*>(block + m.at), static_cast<CUtensorMapDataType>(m.dtype), m.rank, base, m.dims,
          m.strides, m.box, m.element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
          static_cast<CUtensorMapSwizzle>(m.swizzle), CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
          static_cast<CUtensorMapFloatOOBfill>(m.fill));
      check_cuda(encoded, "cuTensorMapEncodeTiled");
    }
    std::vector<void*> params(l.offsets.size());
    for (size_t i = 0; i < params.size(); ++i) params[i] = block + l.offsets[i];
    CUlaunchAttribute attrs[3];
    unsigned count = 0;
    if (l.pdl) {
      attrs[count].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attrs[count++].value.programmaticStreamSerializationAllowed = 1;
    }
    if (l.cooperative) {
      attrs[count].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attrs[count++].value.cooperative = 1;
    }
    if (l.ctas != 1) {
      attrs[count].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attrs[count].value.clusterDim.x = l.ctas;
      attrs[count].value.clusterDim.y = 1;
      attrs[count++].value.clusterDim.z = 1;
    }
    CUlaunchConfig config{};
    config.gridDimX = l.grid[0] * l.ctas;
    config.gridDimY = l.grid[1];
    config.gridDimZ = l.grid[2];
    config.blockDimX = l.threads;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = l.shared;
    config.hStream = stream;
    config.attrs = attrs;
    config.numAttrs = count;
    if (l.grid[0] * l.grid[1] * l.grid[2] == 0) return;
    check_cuda(driver().launch(&config, l.function, params.data(), nullptr), "cuLaunchKernelEx");
  }

  static py::object view(const Output& o, const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& buffers) {
    const at::Tensor& source = o.ref.source == INPUT ? inputs[o.ref.index] : buffers[o.ref.index];
    c10::Storage storage = source.storage();
    int64_t byte_offset = static_cast<int64_t>(reinterpret_cast<uintptr_t>(source.data_ptr()) -
                                               reinterpret_cast<uintptr_t>(storage.data())) + o.ref.offset;
    at::Tensor out = at::empty({0}, source.options().dtype(o.dtype));
    out.set_(storage, byte_offset / static_cast<int64_t>(c10::elementSize(o.dtype)), o.sizes, o.strides);
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(out));
  }

  py::object fallback_, device_, stream_;
  std::unordered_map<std::string, Plan> plans_;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace

PYBIND11_MODULE(_launch_plans, m) {
  m.doc() = "An op call served from a recorded launch plan (bringup_kernels/native/launch_plans.cpp).";
  m.def("api_version", [] { return API_VERSION; });
  py::class_<Table>(m, "Table")
      .def(py::init<py::object, py::object, py::object>(), py::arg("fallback"), py::arg("current_device"),
           py::arg("current_stream"))
      .def("__call__", &Table::call)
      .def("key", &Table::key)
      .def("add", &Table::add)
      .def("clear", &Table::clear)
      .def("__len__", &Table::size)
      .def_property_readonly("hits", &Table::hits)
      .def_property_readonly("misses", &Table::misses);
}
