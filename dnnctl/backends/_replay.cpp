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
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <cstdint>
#include <cstring>
#include <typeinfo>
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

// a view of a slot's tensor as a step reads it (sizes, strides, storage offset past the
// slot tensor's own); ``same``: the slot's tensor itself
struct View {
    bool same = true;
    std::vector<int64_t> sizes, strides;
    int64_t offset = 0;

    at::Tensor of(const at::Tensor &t) const {
        if (same || !t.defined()) return t;
        if (plain(t)) {  // an alias of the storage, made without the dispatcher (~0.5 us)
            auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(t.storage()),
                                                             t.key_set(), t.dtype());
            impl->set_sizes_and_strides(at::IntArrayRef(sizes), at::IntArrayRef(strides),
                                        t.storage_offset() + offset);
            return at::Tensor(std::move(impl));
        }
        return t.as_strided(sizes, strides, t.storage_offset() + offset);
    }

    // A strided tensor of torch's own TensorImpl with no key that changes what its data
    // means or who runs its ops (Python subclasses, functionalization, lazy conjugate /
    // negative views, zero tensors). Its alias is a tensor of its own (no view tracking,
    // its own version counter): right for what a step reads and for a result whose base
    // is dropped, both with no autograd history (a Program records none).
    static bool plain(const at::Tensor &t) {
        const c10::TensorImpl *impl = t.unsafeGetTensorImpl();
        static const c10::DispatchKeySet odd({c10::DispatchKey::Python,
                                              c10::DispatchKey::PythonTLSSnapshot,
                                              c10::DispatchKey::Functionalize,
                                              c10::DispatchKey::Conjugate,
                                              c10::DispatchKey::Negative,
                                              c10::DispatchKey::ZeroTensor});
        return typeid(*impl) == typeid(c10::TensorImpl) && t.layout() == at::kStrided &&
               !t.requires_grad() && !impl->key_set().has_any(odd);
    }
};

static View view_of(py::handle h) {
    View v;
    if (h.is_none()) return v;
    auto t = h.cast<py::tuple>();
    v.same = false;
    v.sizes = t[0].cast<std::vector<int64_t>>();
    v.strides = t[1].cast<std::vector<int64_t>>();
    v.offset = t[2].cast<int64_t>();
    if (v.sizes.size() != v.strides.size())
        throw std::invalid_argument("replay: a view's sizes and strides differ in length");
    return v;
}

// A library call torch makes (an ATen operator, called boxed through the dispatcher), as a
// vendor variant made it: each argument a slot's tensor (through a view) or a constant of
// the recording; each of its results a made output seeing one return through a view.
struct AtenArg {
    int slot = -1;  // >= 0: a slot's tensor; -1: ``value``
    View view;
    c10::IValue value;
};

struct AtenOut {
    size_t ret;  // the return's index
    int slot;    // the made output it becomes
    View view;
    std::vector<int64_t> sizes, strides;  // the return as recorded
};

// The operators a vendor variant calls per step most, called typed (unboxed) where their
// recorded arguments allow it: no IValue stack, no SymInt list conversions (~1-2 us a call
// on a boxed convolution). Everything else goes boxed through the dispatcher.
enum class Typed { none, convolution, cudnn_convolution, conv_relu, conv_add_relu };

struct AtenCall {
    c10::OperatorHandle op;
    std::vector<AtenArg> args;
    std::vector<AtenOut> outs;
    size_t returns = 0;
    Typed typed = Typed::none;
    std::vector<int64_t> stride, padding, dilation, output_padding;
    int64_t groups = 1;
    bool flag = false;  // convolution: transposed; cudnn_convolution: allow_tf32
    c10::optional<at::Scalar> alpha;  // cudnn_convolution_add_relu's

    explicit AtenCall(c10::OperatorHandle h) : op(std::move(h)) {}

    // after the arguments are in: the typed call this one can take, if any
    void settle() {
        const auto &name = op.schema().name();
        const auto &overload = op.schema().overload_name();
        auto ints = [&](size_t i, std::vector<int64_t> &to) {
            if (args[i].slot >= 0 || !args[i].value.isIntList()) return false;
            to = args[i].value.toIntVector();
            return true;
        };
        auto tensor_or_none = [&](size_t i) { return args[i].slot >= 0 || args[i].value.isNone(); };
        if (name == "aten::convolution" && overload.empty() && args.size() == 9) {
            // (input, weight, bias?, stride, padding, dilation, transposed, output_padding,
            // groups)
            if (args[0].slot >= 0 && args[1].slot >= 0 && tensor_or_none(2) &&
                ints(3, stride) && ints(4, padding) && ints(5, dilation) &&
                args[6].slot < 0 && args[6].value.isBool() && ints(7, output_padding) &&
                args[8].slot < 0 && args[8].value.isInt()) {
                flag = args[6].value.toBool();
                groups = args[8].value.toInt();
                typed = Typed::convolution;
            }
        } else if (name == "aten::cudnn_convolution_relu" && overload.empty() &&
                   args.size() == 7) {
            // (input, weight, bias?, stride, padding, dilation, groups)
            if (args[0].slot >= 0 && args[1].slot >= 0 && tensor_or_none(2) &&
                ints(3, stride) && ints(4, padding) && ints(5, dilation) &&
                args[6].slot < 0 && args[6].value.isInt()) {
                groups = args[6].value.toInt();
                typed = Typed::conv_relu;
            }
        } else if (name == "aten::cudnn_convolution_add_relu" && overload.empty() &&
                   args.size() == 9) {
            // (input, weight, z, alpha?, bias?, stride, padding, dilation, groups)
            if (args[0].slot >= 0 && args[1].slot >= 0 && args[2].slot >= 0 &&
                args[3].slot < 0 && (args[3].value.isNone() || args[3].value.isScalar()) &&
                tensor_or_none(4) && ints(5, stride) && ints(6, padding) &&
                ints(7, dilation) && args[8].slot < 0 && args[8].value.isInt()) {
                if (!args[3].value.isNone()) alpha = args[3].value.toScalar();
                groups = args[8].value.toInt();
                typed = Typed::conv_add_relu;
            }
        } else if (name == "aten::cudnn_convolution" && overload.empty() && args.size() == 9) {
            // (input, weight, padding, stride, dilation, groups, benchmark, deterministic,
            // allow_tf32): benchmark and deterministic are read from torch's context per
            // call, as aten::convolution reads them before it calls this; allow_tf32 as
            // recorded (it is read per op kind in newer torch; a float32 call, the only one
            // it changes, refuses its recording in the vendor variant)
            if (args[0].slot >= 0 && args[1].slot >= 0 && ints(2, padding) &&
                ints(3, stride) && ints(4, dilation) && args[5].slot < 0 &&
                args[5].value.isInt() && args[8].slot < 0 && args[8].value.isBool()) {
                groups = args[5].value.toInt();
                flag = args[8].value.toBool();
                typed = Typed::cudnn_convolution;
            }
        }
    }

    at::Tensor tensor(const std::vector<at::Tensor> &slots, size_t i) const {
        const AtenArg &a = args[i];
        return a.slot >= 0 ? a.view.of(slots[a.slot]) : at::Tensor();
    }

    // a ``Tensor?`` argument: the slot's tensor, or none where the recording passed None
    c10::optional<at::Tensor> maybe(const std::vector<at::Tensor> &slots, size_t i) const {
        if (args[i].slot < 0) return c10::nullopt;
        return tensor(slots, i);
    }

    // 0, or NO_FIT (-2): a result is not laid out as recorded
    int run(std::vector<at::Tensor> &slots) const {
        torch::jit::Stack stack;
        if (typed == Typed::convolution) {
            stack.emplace_back(at::convolution(tensor(slots, 0), tensor(slots, 1),
                                               maybe(slots, 2), stride, padding, dilation, flag,
                                               output_padding, groups));
        } else if (typed == Typed::conv_relu) {
            stack.emplace_back(at::cudnn_convolution_relu(tensor(slots, 0), tensor(slots, 1),
                                                          maybe(slots, 2), stride, padding,
                                                          dilation, groups));
        } else if (typed == Typed::conv_add_relu) {
            stack.emplace_back(at::cudnn_convolution_add_relu(
                tensor(slots, 0), tensor(slots, 1), tensor(slots, 2), alpha, maybe(slots, 4),
                stride, padding, dilation, groups));
        } else if (typed == Typed::cudnn_convolution && !at::globalContext().userEnabledCuDNN()) {
            // cuDNN turned off since the recording: torch's convolution picks another kernel
            std::vector<int64_t> zeros(stride.size(), 0);
            stack.emplace_back(at::convolution(tensor(slots, 0), tensor(slots, 1), c10::nullopt,
                                               stride, padding, dilation, false, zeros, groups));
        } else if (typed == Typed::cudnn_convolution) {
            auto &ctx = at::globalContext();
            stack.emplace_back(at::cudnn_convolution(
                tensor(slots, 0), tensor(slots, 1), padding, stride, dilation, groups,
                ctx.benchmarkCuDNN(), ctx.deterministicCuDNN() || ctx.deterministicAlgorithms(),
                flag));
        } else {
            stack.reserve(args.size());
            for (const auto &a : args) {
                if (a.slot >= 0)
                    stack.emplace_back(a.view.of(slots[a.slot]));
                else
                    stack.push_back(a.value);
            }
            op.callBoxed(&stack);
        }
        if (stack.size() != returns) return -2;
        for (const auto &o : outs) {
            const c10::IValue &r = stack[o.ret];
            if (!r.isTensor()) return -2;
            const at::Tensor &t = r.toTensor();
            if (t.sizes() != at::IntArrayRef(o.sizes) || t.strides() != at::IntArrayRef(o.strides))
                return -2;
            slots[o.slot] = o.view.of(t);
        }
        return 0;
    }
};

struct Step {
    int torch = -1;  // an AtenCall (its index), else a launch
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
    bool made = false;  // a step's result (a library's output adopted), not allocated
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
            bool tuple_result, int device_type, int device_index,
            std::vector<int> made = {})
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
        for (int j : made) {
            if (j < 0 || j >= static_cast<int>(allocs_.size()))
                throw std::invalid_argument("replay: a made output that is no output");
            allocs_[j].made = true;
        }
        n_slots_ = n_in_ + static_cast<int>(allocs_.size() + temps_.size());
        if (n_slots_ > MAX_SLOTS) throw std::invalid_argument("replay: too many tensors");
        std::vector<bool> ready(n_slots_, true);  // a made output: once its step has run
        for (int j : made) ready[n_in_ + j] = false;
        for (auto item : steps) {
            auto t = item.cast<py::tuple>();
            Step s;
            if (py::isinstance<py::str>(t[0])) {  // ("aten", name, overload, args, outs)
                if (t[0].cast<std::string>() != "aten" || t.size() != 5)
                    throw std::invalid_argument("replay: an unknown torch step");
                // before any launch: a result laid out otherwise than recorded leaves the
                // call to the Python path with nothing launched yet
                if (steps_.size() != calls_.size())
                    throw std::invalid_argument("replay: a torch step after a launch");
                auto handle = c10::Dispatcher::singleton().findSchema(
                    {t[1].cast<std::string>(), t[2].cast<std::string>()});
                if (!handle)
                    throw std::invalid_argument("replay: no such ATen operator");
                AtenCall c(*handle);
                const auto &schema = c.op.schema();
                auto items = t[3].cast<py::list>();
                if (items.size() != schema.arguments().size())
                    throw std::invalid_argument("replay: not the operator's arguments");
                size_t i = 0;
                for (auto item : items) {
                    auto a = item.cast<py::tuple>();
                    AtenArg arg;
                    if (a[0].cast<std::string>() == "t") {
                        arg.slot = a[1].cast<int>();
                        if (arg.slot < 0 || arg.slot >= n_slots_ || !ready[arg.slot])
                            throw std::invalid_argument("replay: a step reads no tensor made yet");
                        arg.view = view_of(a[2]);
                    } else {
                        arg.value = torch::jit::toIValue(a[1], schema.arguments()[i].type());
                    }
                    c.args.push_back(std::move(arg));
                    i++;
                }
                c.returns = schema.returns().size();
                c.settle();
                for (auto item : t[4].cast<py::list>()) {
                    auto o = item.cast<py::tuple>();
                    AtenOut out{o[0].cast<size_t>(), o[1].cast<int>(), view_of(o[2]),
                                o[3].cast<std::vector<int64_t>>(),
                                o[4].cast<std::vector<int64_t>>()};
                    if (out.ret >= c.returns || out.slot < n_in_ ||
                        out.slot >= n_in_ + static_cast<int>(allocs_.size()) ||
                        !allocs_[out.slot - n_in_].made || ready[out.slot])
                        throw std::invalid_argument("replay: a step's result is no made output");
                    ready[out.slot] = true;
                    c.outs.push_back(std::move(out));
                }
                s.torch = static_cast<int>(calls_.size());
                calls_.push_back(std::move(c));
                steps_.push_back(std::move(s));
                continue;
            }
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
                if (!ready[q.slot])
                    throw std::invalid_argument("replay: a launch reads no tensor made yet");
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
        for (int k = 0; k < n_slots_; k++)
            if (!ready[k]) throw std::invalid_argument("replay: a made output no step makes");
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
        std::vector<at::Tensor> slots(n_slots_);
        for (int i = 0; i < n_in_; i++) {
            PyObject *o = arrays[i].ptr();
            if (o == Py_None) continue;
            if (!THPVariable_Check(o)) return py::none();
            slots[i] = THPVariable_Unpack(o);
        }
        int rc = exec(slots, dry);
        if (rc == NO_FIT) return py::none();
        if (rc != 0) return py::int_(rc);
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

    static constexpr int NO_FIT = -2;

    // Runs the program on ``slots`` (the inputs first, undefined for None; the rest are
    // made here): 0, NO_FIT (nothing was launched: a torch step, which comes first, may
    // have computed a result and dropped it), or a launch's error code. ``dry``: the
    // parameter blocks are appended there instead of launched (the GIL held).
    int exec(std::vector<at::Tensor> &slots, py::list *dry = nullptr) const {
        if (static_cast<int>(slots.size()) != n_slots_) return NO_FIT;
        uint64_t ptrs[MAX_SLOTS];
        for (int i = 0; i < n_in_; i++) {
            const at::Tensor &t = slots[i];
            if (!t.defined()) {
                if (align_[i] != 0) return NO_FIT;
                ptrs[i] = 0;
                continue;
            }
            if (align_[i] == 0 || t.device() != device_) return NO_FIT;
            uint64_t p = reinterpret_cast<uint64_t>(t.data_ptr());
            if (align_class(p) < align_[i]) return NO_FIT;
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
            if (!a.made) {
                slots[k] = at::empty_strided(a.sizes, a.strides, a.options);
                ptrs[k] = reinterpret_cast<uint64_t>(slots[k].data_ptr());
            }
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
            if (s.torch >= 0) {  // (a dry run computes it too: later launches read it)
                const AtenCall &c = calls_[s.torch];
                if (c.run(slots) != 0) return NO_FIT;
                for (const auto &o : c.outs)
                    ptrs[o.slot] = reinterpret_cast<uint64_t>(slots[o.slot].data_ptr());
                continue;
            }
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
                if (LAUNCH_COOP == nullptr) return -1;
                rc = LAUNCH_COOP(fn, s.dims[0], s.dims[1], s.dims[2], s.dims[3], s.dims[4],
                                 s.dims[5], s.dims[6], stream, params);
            } else {
                if (LAUNCH == nullptr) return -1;
                rc = LAUNCH(fn, s.dims[0], s.dims[1], s.dims[2], s.dims[3], s.dims[4],
                            s.dims[5], s.dims[6], stream, params, nullptr);
            }
            if (rc != 0) return rc;
        }
        return 0;
    }

    // the j-th returned value of an exec'd call (undefined for None)
    at::Tensor result(const std::vector<at::Tensor> &slots, size_t j) const {
        if (j >= result_.size() || result_[j] < 0) return at::Tensor();
        return slots[result_[j]];
    }

    int inputs() const { return n_in_; }
    int slot_count() const { return n_slots_; }

    int launches() const { return static_cast<int>(steps_.size() - calls_.size()); }
    int torch_calls() const { return static_cast<int>(calls_.size()); }

  private:
    int n_in_, n_slots_;
    std::vector<int> align_;
    std::vector<Alloc> allocs_;
    std::vector<int64_t> temps_;
    std::vector<Step> steps_;
    std::vector<AtenCall> calls_;
    std::vector<int> result_;
    bool tuple_result_;
    c10::Device device_;
};

// ----------------------------------------------------------------------------- autograd
//
// A training batch_norm (+ residual, + ReLU) whose forward and backward dispatch sites both
// recorded a Program: the forward runs its Program and records a C++ autograd node whose
// backward runs the other, so neither pass goes through Python (dnnctl/torch/native.py).

namespace ag = torch::autograd;
using NodePtr = decltype(std::declval<ag::Edge>().function);

template <class N, class P = NodePtr>
struct MakeNode;
template <class N>
struct MakeNode<N, std::shared_ptr<ag::Node>> {  // torch before the intrusive Node
    static std::shared_ptr<N> make() { return std::shared_ptr<N>(new N()); }
};
template <class N>
struct MakeNode<N, c10::intrusive_ptr<ag::Node>> {
    static c10::intrusive_ptr<N> make() { return c10::make_intrusive<N>(); }
};

// a node's own pointer (for unpacking an output it saved), whichever pointer torch uses
template <class N, class P = NodePtr>
struct SelfPtr;
template <class N>
struct SelfPtr<N, std::shared_ptr<ag::Node>> {
    static std::shared_ptr<ag::Node> of(N *n) { return n->shared_from_this(); }
};
template <class N>
struct SelfPtr<N, c10::intrusive_ptr<ag::Node>> {
    static c10::intrusive_ptr<ag::Node> of(N *n) {
        return c10::intrusive_ptr<ag::Node>::reclaim_copy(n);
    }
};

struct BnSpec {
    std::shared_ptr<Program> fwd, bwd;
    bool nhwc;         // x channels_last: the Programs see its NHWC view (same address)
    bool bias_in_bwd;  // the backward reads the bias (the ReLU's mask is recomputed)
    double eps;        // for the differentiable fallback
    int64_t plan;
    std::string activation;
};

// Python's batch_norm backward (dnnctl.torch.native._differentiable_backward), for a
// backward that must itself be differentiable (create_graph=True): torch's formulas, as the
// Python path runs them. Held for the life of the process (a node may be freed with no GIL).
static PyObject *BN_FALLBACK = nullptr;

static void set_bn_fallback(py::object fn) {
    Py_XINCREF(fn.ptr());
    BN_FALLBACK = fn.ptr();
}

static py::object wrap_or_none(const at::Tensor &t) {
    if (!t.defined()) return py::none();
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
}

// the call arrays of dnnctl's batch_norm and batch_norm_backward (the op functions' order)
enum { F_X, F_RM, F_RV, F_W, F_B, F_OUT, F_RES, F_NRM, F_NRV, F_N };
enum { B_DY, B_X, B_W, B_MEAN, B_INVSTD, B_BIAS, B_RES, B_N };

struct BnTrainBackward : public ag::Node {
    std::shared_ptr<BnSpec> spec;
    ag::SavedVariable x_, w_, b_, mean_, invstd_, res_, y_;

    ag::variable_list apply(ag::variable_list &&grads) override {
        ag::variable_list out(4);
        at::Tensor dy = grads[0];
        if (!dy.defined()) return out;
        at::Tensor x = x_.unpack(), res = res_.unpack();
        // torch's formulas from Python: a backward that must be differentiable, or one
        // whose dispatch site runs no Program (the plan or heuristic gave it to torch)
        if (at::GradMode::is_enabled() || !spec->bwd) return differentiable(dy, x, res);
        auto fmt = spec->nhwc ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
        if (dy.strides() != x.strides()) dy = dy.contiguous(fmt);
        const Program &p = *spec->bwd;
        std::vector<at::Tensor> slots(p.slot_count());
        slots[B_DY] = dy;
        slots[B_X] = x;
        slots[B_W] = w_.unpack();
        slots[B_MEAN] = mean_.unpack();
        slots[B_INVSTD] = invstd_.unpack();
        if (spec->bias_in_bwd) slots[B_BIAS] = b_.unpack();
        slots[B_RES] = res;
        int rc = p.exec(slots);
        if (rc == Program::NO_FIT) {  // a gradient less aligned than the recorded one
            slots[B_DY] = dy.clone(fmt);
            rc = p.exec(slots);
        }
        TORCH_CHECK(rc == 0, "dnnctl: a replayed batch_norm backward failed to launch (",
                    rc, "); DNNCTL_REPLAY=0 turns the replay path off");
        at::Tensor dx = p.result(slots, 0), dz;
        if (res.defined()) dz = p.result(slots, 3);
        if (spec->nhwc) {
            dx = dx.permute({0, 3, 1, 2});
            if (dz.defined()) dz = dz.permute({0, 3, 1, 2});
        }
        out[0] = dx;
        out[1] = p.result(slots, 1);
        out[2] = p.result(slots, 2);
        out[3] = dz;
        return out;
    }

    std::string name() const override { return "DnnctlBackward_batch_norm_train_native"; }

    ag::variable_list differentiable(const at::Tensor &dy, const at::Tensor &x,
                                     const at::Tensor &res) {
        TORCH_CHECK(BN_FALLBACK != nullptr, "dnnctl: no differentiable batch_norm backward");
        ag::variable_list out(4);
        py::gil_scoped_acquire gil;
        py::tuple needs = py::make_tuple(should_compute_output(0), should_compute_output(1),
                                         should_compute_output(2), should_compute_output(3));
        py::object got = py::reinterpret_borrow<py::object>(BN_FALLBACK)(
            wrap_or_none(dy), wrap_or_none(x), wrap_or_none(w_.unpack()),
            wrap_or_none(b_.unpack()), wrap_or_none(mean_.unpack()),
            wrap_or_none(invstd_.unpack()), wrap_or_none(res),
            wrap_or_none(y_.unpack(SelfPtr<BnTrainBackward>::of(this))), needs, spec->eps, spec->plan,
            spec->activation);
        py::tuple t = got.cast<py::tuple>();
        for (size_t i = 0; i < 4 && i < t.size(); i++)
            if (!t[i].is_none()) out[i] = THPVariable_Unpack(t[i].ptr());
        return out;
    }

    void release_variables() override {
        x_.reset_data();
        w_.reset_data();
        b_.reset_data();
        mean_.reset_data();
        invstd_.reset_data();
        res_.reset_data();
        y_.reset_data();
    }
};

class BnTrain {
  public:
    BnTrain(std::shared_ptr<Program> fwd, std::shared_ptr<Program> bwd, bool nhwc,
            bool bias_in_bwd, double eps, int64_t plan, std::string activation)
        : spec_(std::make_shared<BnSpec>(BnSpec{std::move(fwd), std::move(bwd), nhwc,
                                                bias_in_bwd, eps, plan,
                                                std::move(activation)})) {
        if (spec_->fwd->inputs() != F_N || (spec_->bwd && spec_->bwd->inputs() != B_N))
            throw std::invalid_argument("BnTrain: not batch_norm's call arrays");
    }

    // y, its running statistics updated in place, and its autograd node where a gradient
    // is wanted; None where the recording does not fit the call; an int for a failed launch
    py::object call(py::object x, py::object w, py::object b, py::object res, py::object rm,
                    py::object rv) {
        at::Tensor t[6];
        PyObject *objs[6] = {x.ptr(), w.ptr(), b.ptr(), res.ptr(), rm.ptr(), rv.ptr()};
        for (int i = 0; i < 6; i++) {
            if (objs[i] == Py_None) continue;
            if (!THPVariable_Check(objs[i])) return py::none();
            t[i] = THPVariable_Unpack(objs[i]);
        }
        const at::Tensor &xt = t[0];
        if (!xt.defined() || !t[4].defined() || !t[5].defined()) return py::none();
        const Program &p = *spec_->fwd;
        auto fmt = spec_->nhwc ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
        at::Tensor y = at::empty_like(xt, at::TensorOptions(), fmt);
        std::vector<at::Tensor> slots(p.slot_count());
        slots[F_X] = xt;
        slots[F_RM] = t[4];
        slots[F_RV] = t[5];
        slots[F_W] = t[1];
        slots[F_B] = t[2];
        slots[F_OUT] = y;
        slots[F_RES] = t[3];
        int rc = p.exec(slots);
        if (rc == Program::NO_FIT) return py::none();
        if (rc != 0) return py::int_(rc);
        ag::impl::bump_version(t[4]);
        ag::impl::bump_version(t[5]);
        if (ag::compute_requires_grad(xt, t[1], t[2], t[3])) {
            auto node = MakeNode<BnTrainBackward>::make();
            node->spec = spec_;
            node->set_next_edges(ag::collect_next_edges(xt, t[1], t[2], t[3]));
            node->x_ = ag::SavedVariable(xt, false);
            node->w_ = ag::SavedVariable(t[1], false);
            node->b_ = ag::SavedVariable(t[2], false);
            node->mean_ = ag::SavedVariable(p.result(slots, 1), false);
            node->invstd_ = ag::SavedVariable(p.result(slots, 2), false);
            node->res_ = ag::SavedVariable(t[3], false);
            ag::set_history(y, node);
            // the fused ReLU's output gates torch's gradient (what the ReLU's node keeps)
            if (!spec_->bwd && spec_->activation == "relu") node->y_ = ag::SavedVariable(y, true);
        }
        return py::reinterpret_steal<py::object>(THPVariable_Wrap(y));
    }

    bool own_backward() const { return static_cast<bool>(spec_->bwd); }

  private:
    std::shared_ptr<BnSpec> spec_;
};

// ----------------------------------------------------------------------------- signature
//
// The part of a dispatch site's key that describes its arrays (dnnctl/ops/dispatch.py),
// for a tuple of torch tensors and Nones: per array its Python type, sizes, strides, dtype,
// device and requires_grad, packed into one bytes object (exact, no hash of it stands for
// it). None where an element is something else or a tensor without concrete strided
// sizes; the caller then makes its key in Python. ~0.2 us against ~0.8 us in Python for
// two tensors.
static PyTypeObject *PARAMETER_TYPE = nullptr;

static PyObject *signature_of(PyObject *, PyObject *arrays) {
    if (!PyTuple_Check(arrays)) Py_RETURN_NONE;
    char buf[4096];
    size_t len = 0;
    try {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(arrays); i++) {
            PyObject *o = PyTuple_GET_ITEM(arrays, i);
            if (o == Py_None) {
                buf[len++] = 0;
                continue;
            }
            // torch.Tensor and nn.Parameter only: a subclass of a user's takes the Python
            // key, whose signature() refuses it
            if (Py_TYPE(o) != reinterpret_cast<PyTypeObject *>(THPVariableClass) &&
                Py_TYPE(o) != PARAMETER_TYPE)
                Py_RETURN_NONE;
            const at::Tensor &t = THPVariable_Unpack(o);
            const c10::TensorImpl *impl = t.unsafeGetTensorImpl();
            if (t.layout() != at::kStrided || impl->has_symbolic_sizes_strides())
                Py_RETURN_NONE;
            size_t dim = static_cast<size_t>(t.dim());
            if (len + 16 + 16 * dim > sizeof buf) Py_RETURN_NONE;
            buf[len++] = 1;
            uintptr_t type = reinterpret_cast<uintptr_t>(Py_TYPE(o));
            std::memcpy(buf + len, &type, sizeof type);
            len += sizeof type;
            buf[len++] = static_cast<char>(dim);
            std::memcpy(buf + len, t.sizes().data(), 8 * dim);
            len += 8 * dim;
            std::memcpy(buf + len, t.strides().data(), 8 * dim);
            len += 8 * dim;
            buf[len++] = static_cast<char>(t.scalar_type());
            buf[len++] = static_cast<char>(t.device().type());
            buf[len++] = static_cast<char>(t.device().index());
            buf[len++] = static_cast<char>(t.requires_grad());
        }
    } catch (const std::exception &) {
        Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize(buf, static_cast<Py_ssize_t>(len));
}

static PyMethodDef SIGNATURE_DEF = {"signature", signature_of, METH_O,
                                    "the arrays' part of a dispatch site's key, or None"};

// ----------------------------------------------------------------------------- state
//
// What a captured CUDA graph of a model's forward depends on (dnnctl/torch/graphs.py): for
// each (dict, key) pair, the identity of the value stored there (0 where there is none) and,
// for a tensor, its data pointer and, with ``versions``, its version counter (0 for an
// inference tensor, which has none), packed into one bytes object; a pair (dict, ...)
// stands for the dict's size. The caller keeps the
// values alive, so an identity is never reused. ~10 ns a pair against ~0.3 us in Python.
static PyObject *state_of(PyObject *, PyObject *args) {
    PyObject *pairs = nullptr;
    int versions = 0;
    if (!PyArg_ParseTuple(args, "O!p", &PyTuple_Type, &pairs, &versions)) return nullptr;
    Py_ssize_t n = PyTuple_GET_SIZE(pairs);
    std::vector<int64_t> buf(static_cast<size_t>(3 * n), 0);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(pairs, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyDict_Check(PyTuple_GET_ITEM(pair, 0))) {
            PyErr_SetString(PyExc_TypeError, "state: expected a tuple of (dict, key) pairs");
            return nullptr;
        }
        int64_t *row = buf.data() + 3 * i;
        if (PyTuple_GET_ITEM(pair, 1) == Py_Ellipsis) {  // (dict, ...): its size
            row[0] = static_cast<int64_t>(PyDict_Size(PyTuple_GET_ITEM(pair, 0)));
            continue;
        }
        PyObject *v = PyDict_GetItemWithError(PyTuple_GET_ITEM(pair, 0),
                                              PyTuple_GET_ITEM(pair, 1));
        if (v == nullptr) {
            if (PyErr_Occurred()) return nullptr;
            continue;
        }
        row[0] = static_cast<int64_t>(reinterpret_cast<intptr_t>(v));
        // (the type's MRO, not isinstance: no __instancecheck__ for the many plain values)
        if (!PyType_IsSubtype(Py_TYPE(v), reinterpret_cast<PyTypeObject *>(THPVariableClass)))
            continue;
        const at::Tensor &t = THPVariable_Unpack(v);
        if (!t.defined()) continue;
        const c10::TensorImpl *impl = t.unsafeGetTensorImpl();
        if (impl->has_storage())
            row[1] = static_cast<int64_t>(
                reinterpret_cast<intptr_t>(impl->unsafe_storage().data())) +
                     impl->storage_offset() * static_cast<int64_t>(impl->itemsize());
        if (versions && impl->version_counter().enabled())
            row[2] = static_cast<int64_t>(impl->version_counter().current_version());
    }
    return PyBytes_FromStringAndSize(reinterpret_cast<const char *>(buf.data()),
                                     static_cast<Py_ssize_t>(buf.size() * sizeof(int64_t)));
}

static PyMethodDef STATE_DEF = {"state", state_of, METH_VARARGS,
                                "what a captured graph of a forward depends on, as bytes"};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    PARAMETER_TYPE = reinterpret_cast<PyTypeObject *>(
        py::module_::import("torch.nn.parameter").attr("Parameter").ptr());  // (kept alive)
    m.add_object("signature", py::reinterpret_steal<py::object>(
                                  PyCFunction_New(&SIGNATURE_DEF, nullptr)));
    m.add_object("state", py::reinterpret_steal<py::object>(
                              PyCFunction_New(&STATE_DEF, nullptr)));
    m.doc() = "dnnctl's replay of recorded launch programs";
    m.def("set_bn_fallback", &set_bn_fallback, "the differentiable batch_norm backward");
    // the slot names of the enums above (a test holds them to the op functions' order)
    m.attr("BN_FORWARD_SLOTS") = py::make_tuple("x", "running_mean", "running_var", "weight",
                                                "bias", "out", "residual", "new_mean",
                                                "new_var");
    m.attr("BN_BACKWARD_SLOTS") = py::make_tuple("dy", "x", "weight", "save_mean",
                                                 "save_invstd", "bias", "residual");
    m.def("set_launch", &set_launch, "cuLaunchKernel's and cuLaunchCooperativeKernel's addresses");
    py::class_<Program, std::shared_ptr<Program>>(m, "Program")
        .def(py::init<int, std::vector<int>, std::vector<at::Tensor>,
                      std::vector<std::vector<int64_t>>, std::vector<std::vector<int64_t>>,
                      std::vector<int64_t>, py::list, std::vector<int>, bool, int, int,
                      std::vector<int>>(),
             py::arg("n_in"), py::arg("align"), py::arg("templates"), py::arg("sizes"),
             py::arg("strides"), py::arg("temps"), py::arg("steps"), py::arg("result"),
             py::arg("tuple_result"), py::arg("device_type"), py::arg("device_index"),
             py::arg("made") = std::vector<int>())
        .def("__call__", &Program::call)
        .def("dry", &Program::dry)
        .def_property_readonly("launches", &Program::launches)
        .def_property_readonly("torch_calls", &Program::torch_calls)
        .def_property_readonly("inputs", &Program::inputs);
    py::class_<BnTrain>(m, "BnTrain")
        .def(py::init<std::shared_ptr<Program>, std::shared_ptr<Program>, bool, bool, double,
                      int64_t, std::string>())
        .def("__call__", &BnTrain::call)
        .def_property_readonly("own_backward", &BnTrain::own_backward);
}
