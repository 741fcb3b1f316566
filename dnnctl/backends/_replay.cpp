// dnnctl's replay path: a call site's recorded launches, run again from C++ with the new
// call's tensors (see dnnctl/backends/replay.py).
//
// A Program is what one call of a dispatch site did on the device, recorded once: the
// outputs it allocated (sizes, strides, dtype), its per-call scratch buffers (bytes), and
// each kernel launch (CUfunction, grid, block, shared memory, the parameter block with the
// offsets of its parameters, and which parameters are addresses into which tensor, at which
// byte offset). Calling it with the next call's tensors allocates the outputs from torch's
// caching allocator, patches the addresses into copies of the parameter blocks and launches
// on torch's current stream of the tensors' device: no Python between the call and the
// driver. A call it cannot take as recorded (a tensor less aligned than the recorded one,
// one on another device, not a tensor) gets None back, and the caller runs its Python path.
//
// Links libtorch (at::empty_strided, the device guard, the current stream through c10's
// device-generic interface: no CUDA headers); the driver's cuLaunchKernel and
// cuLaunchCooperativeKernel come as addresses from Python (set_launch).
#include <torch/extension.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace py = pybind11;

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
typedef int (*coop_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, void *, void **);
static launch_fn LAUNCH = nullptr;
static coop_fn LAUNCH_COOP = nullptr;

static void set_launch(uint64_t launch, uint64_t coop) {
    LAUNCH = reinterpret_cast<launch_fn>(launch);
    LAUNCH_COOP = reinterpret_cast<coop_fn>(coop);
}

struct Patch {
    uint32_t offset;  // byte offset of the parameter in the block
    int32_t slot;     // the tensor whose address it is
    int64_t delta;    // bytes past that tensor's data pointer
};

struct Step {
    uint64_t handle;
    unsigned dims[7];  // grid x y z, block x y z, dynamic shared memory
    bool cooperative;
    std::vector<uint8_t> block;     // the recorded parameter block
    std::vector<uint32_t> offsets;  // each parameter's byte offset in it
    std::vector<Patch> patches;
};

struct Alloc {
    std::vector<int64_t> sizes, strides;
    at::TensorOptions options;
};

constexpr int MAX_SLOTS = 64;
constexpr size_t MAX_BLOCK = 4096;
constexpr size_t MAX_PARAMS = 256;

static int align_class(uint64_t p) {
    // the largest power of two up to 256 that divides the address (256 for 0)
    if (p == 0) return 256;
    int a = 1;
    while (a < 256 && (p % (2 * a)) == 0) a *= 2;
    return a;
}

class Program {
  public:
    Program(int n_in, std::vector<int> align, std::vector<at::Tensor> templates,
            std::vector<std::vector<int64_t>> sizes, std::vector<std::vector<int64_t>> strides,
            std::vector<int64_t> temps, py::list steps, std::vector<int> result,
            bool tuple_result, int device_type, int device_index)
        : n_in_(n_in), align_(std::move(align)), temps_(std::move(temps)),
          result_(std::move(result)), tuple_result_(tuple_result),
          device_(static_cast<c10::DeviceType>(device_type),
                  static_cast<c10::DeviceIndex>(device_index)) {
        if (static_cast<int>(align_.size()) != n_in_)
            throw std::invalid_argument("replay: one alignment per input");
        if (templates.size() != sizes.size() || sizes.size() != strides.size())
            throw std::invalid_argument("replay: one template, sizes and strides per output");
        for (size_t i = 0; i < templates.size(); i++)
            allocs_.push_back({sizes[i], strides[i], templates[i].options()});
        n_slots_ = n_in_ + static_cast<int>(allocs_.size() + temps_.size());
        if (n_slots_ > MAX_SLOTS) throw std::invalid_argument("replay: too many tensors");
        for (auto item : steps) {
            auto t = item.cast<py::tuple>();
            Step s;
            s.handle = t[0].cast<uint64_t>();
            auto dims = t[1].cast<std::vector<unsigned>>();
            if (dims.size() != 7) throw std::invalid_argument("replay: 7 launch dimensions");
            std::copy(dims.begin(), dims.end(), s.dims);
            s.cooperative = t[2].cast<bool>();
            std::string bytes = t[3].cast<std::string>();
            s.block.assign(bytes.begin(), bytes.end());
            s.offsets = t[4].cast<std::vector<uint32_t>>();
            for (auto p : t[5].cast<py::list>()) {
                auto pt = p.cast<py::tuple>();
                Patch q{pt[0].cast<uint32_t>(), pt[1].cast<int32_t>(), pt[2].cast<int64_t>()};
                if (q.slot < 0 || q.slot >= n_slots_ || q.offset + 8 > s.block.size())
                    throw std::invalid_argument("replay: a patch outside its block");
                s.patches.push_back(q);
            }
            if (s.block.size() > MAX_BLOCK || s.offsets.size() > MAX_PARAMS)
                throw std::invalid_argument("replay: parameter block too large");
            for (auto o : s.offsets)
                if (o >= s.block.size() && !(o == 0 && s.block.empty()))
                    throw std::invalid_argument("replay: a parameter outside its block");
            steps_.push_back(std::move(s));
        }
        for (int r : result_)
            if (r < -1 || r >= n_in_ + static_cast<int>(allocs_.size()))
                throw std::invalid_argument("replay: a result that is no input or output");
    }

    // the call's result; None where the recorded program does not fit the call; an int
    // (the CUresult) where a launch failed
    py::object call(py::tuple arrays) { return run(arrays, nullptr); }

    // (the result, the parameter blocks as they would be launched): nothing is launched
    py::object dry(py::tuple arrays) {
        py::list blocks;
        py::object res = run(arrays, &blocks);
        return py::make_tuple(res, blocks);
    }

    py::object run(py::tuple arrays, py::list *dry) {
        if (static_cast<int>(arrays.size()) != n_in_) return py::none();
        at::Tensor slots[MAX_SLOTS];
        uint64_t ptrs[MAX_SLOTS];
        for (int i = 0; i < n_in_; i++) {
            PyObject *o = arrays[i].ptr();
            if (o == Py_None) {
                if (align_[i] != 0) return py::none();
                ptrs[i] = 0;
                continue;
            }
            if (align_[i] == 0 || !THPVariable_Check(o)) return py::none();
            const at::Tensor &t = THPVariable_Unpack(o);
            if (t.device() != device_) return py::none();
            uint64_t p = reinterpret_cast<uint64_t>(t.data_ptr());
            if (align_class(p) < align_[i]) return py::none();
            ptrs[i] = p;
        }
        c10::OptionalDeviceGuard guard;
        void *stream = nullptr;
        if (device_.type() != c10::DeviceType::CPU) {
            guard.reset_device(device_);
            stream = c10::impl::getDeviceGuardImpl(device_.type())
                         ->getStream(device_)
                         .native_handle();
        }
        int k = n_in_;
        for (const auto &a : allocs_) {
            slots[k] = at::empty_strided(a.sizes, a.strides, a.options);
            ptrs[k] = reinterpret_cast<uint64_t>(slots[k].data_ptr());
            k++;
        }
        for (int64_t n : temps_) {
            slots[k] = at::empty({n}, at::TensorOptions().dtype(at::kByte).device(device_));
            ptrs[k] = reinterpret_cast<uint64_t>(slots[k].data_ptr());
            k++;
        }
        alignas(64) uint8_t buf[MAX_BLOCK];
        void *params[MAX_PARAMS];
        for (const auto &s : steps_) {
            if (!s.block.empty()) std::memcpy(buf, s.block.data(), s.block.size());
            for (const auto &p : s.patches) {
                uint64_t v = ptrs[p.slot] + static_cast<uint64_t>(p.delta);
                std::memcpy(buf + p.offset, &v, 8);
            }
            for (size_t j = 0; j < s.offsets.size(); j++) params[j] = buf + s.offsets[j];
            if (dry != nullptr) {
                dry->append(py::bytes(reinterpret_cast<const char *>(buf), s.block.size()));
                continue;
            }
            int rc;
            void *fn = reinterpret_cast<void *>(s.handle);
            if (s.cooperative) {
                if (LAUNCH_COOP == nullptr) return py::int_(-1);
                rc = LAUNCH_COOP(fn, s.dims[0], s.dims[1], s.dims[2], s.dims[3], s.dims[4],
                                 s.dims[5], s.dims[6], stream, params);
            } else {
                if (LAUNCH == nullptr) return py::int_(-1);
                rc = LAUNCH(fn, s.dims[0], s.dims[1], s.dims[2], s.dims[3], s.dims[4],
                            s.dims[5], s.dims[6], stream, params, nullptr);
            }
            if (rc != 0) return py::int_(rc);
        }
        auto one = [&](int r) -> py::object {
            if (r < 0) return py::none();
            if (r < n_in_) return py::reinterpret_borrow<py::object>(arrays[r]);
            return py::reinterpret_steal<py::object>(THPVariable_Wrap(slots[r]));
        };
        if (!tuple_result_) return one(result_.empty() ? -1 : result_[0]);
        py::tuple out(result_.size());
        for (size_t j = 0; j < result_.size(); j++) out[j] = one(result_[j]);
        return std::move(out);
    }

    int launches() const { return static_cast<int>(steps_.size()); }

  private:
    int n_in_, n_slots_;
    std::vector<int> align_;
    std::vector<Alloc> allocs_;
    std::vector<int64_t> temps_;
    std::vector<Step> steps_;
    std::vector<int> result_;
    bool tuple_result_;
    c10::Device device_;
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "dnnctl's replay of recorded launch programs";
    m.def("set_launch", &set_launch, "cuLaunchKernel's and cuLaunchCooperativeKernel's addresses");
    py::class_<Program>(m, "Program")
        .def(py::init<int, std::vector<int>, std::vector<at::Tensor>,
                      std::vector<std::vector<int64_t>>, std::vector<std::vector<int64_t>>,
                      std::vector<int64_t>, py::list, std::vector<int>, bool, int, int>())
        .def("__call__", &Program::call)
        .def("dry", &Program::dry)
        .def_property_readonly("launches", &Program::launches);
}
