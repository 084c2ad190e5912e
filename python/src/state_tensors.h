// StateTensors: how the Python KVPool lays a State layer's named state
// tensors (a conv window, a recurrent matrix: any number, each with its own
// shape and dtype) into one slot of the C++ pool's opaque bytes. Each tensor
// starts on a kAlign boundary of the slot and the slot is a multiple of
// kAlign, so in every slot each tensor is aligned. It parses the
// `state_tensors=` argument (refusing each bad value by name), packs a step's
// states into slot rows (checking every name, shape and dtype before anything
// is written) and unpacks a slot into read-only arrays.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "errors.h"
#include "kvcore/core/config.h"
#include "kvcore/pool/kv_pool.h"
#include "numpy_dtype.h"

namespace kvcore_py {

class StateTensors {
 public:
  /// Every tensor's offset in a slot, and every slot's size, are multiples of this.
  static constexpr std::size_t kAlign = 16;

  struct Tensor {
    std::string name;
    std::vector<Py_intptr_t> shape;
    py::dtype dtype;
    std::size_t offset = 0;  // in the slot
    std::size_t bytes = 0;
  };

  /// A read-only zero-copy (rows, *shape) view of tensor `name` of State
  /// layer `layer` in each of `rows` slots of `slot_bytes` bytes from `base`
  /// (the layer's slots, a block `blocks` keeps alive: its strided_view).
  template <class Blocks>
  py::object slots_view(const Blocks& blocks, int layer, const std::string& name, const unsigned char* base, int rows,
                        std::size_t slot_bytes) const {
    const Tensor& t = tensor("state_slots", layer, name);
    std::vector<Py_intptr_t> dims{rows}, strides{static_cast<Py_intptr_t>(slot_bytes)};
    dims.insert(dims.end(), t.shape.begin(), t.shape.end());
    strides.resize(dims.size());
    Py_intptr_t stride = t.dtype.itemsize();
    for (std::size_t d = dims.size(); d-- > 1;) {
      strides[d] = stride;
      stride *= dims[d];
    }
    return blocks.strided_view(base, base + t.offset, t.dtype, static_cast<int>(dims.size()), dims.data(),
                               strides.data());
  }

  /// Parses `spec` for layers of `kinds`: None (only without State layers), a
  /// dict name -> (shape, dtype) for every State layer, or a dict State layer
  /// index -> such a dict. InvalidArgument names the value and the rule.
  static StateTensors parse(py::handle spec, const std::vector<kvcore::LayerPolicy::Kind>& kinds) {
    StateTensors out;
    out.layers_.resize(kinds.size());
    out.slot_bytes_.assign(kinds.size(), 0);
    std::vector<int> state_layers;
    for (std::size_t l = 0; l < kinds.size(); ++l)
      if (kinds[l] == kvcore::LayerPolicy::Kind::State) state_layers.push_back(static_cast<int>(l));
    if (spec.is_none() && state_layers.empty()) return out;
    if (state_layers.empty() && py::isinstance<py::dict>(spec) && py::len(spec) > 0 &&
        py::isinstance<py::str>(*py::reinterpret_borrow<py::dict>(spec).begin()->first))
      raise(kvcore::Error::InvalidArgument, "state_tensors: the cache has no State layer to give tensors to");
    if (!spec.is_none() && !py::isinstance<py::dict>(spec))
      raise(kvcore::Error::InvalidArgument,
            "state_tensors: must be a dict of name -> (shape, dtype), or of State layer index -> such a dict, not " +
                type_name(spec));
    py::dict given = spec.is_none() ? py::dict() : py::reinterpret_borrow<py::dict>(spec);
    bool by_layer = false, by_name = false;
    for (auto item : given) {
      const bool is_int = py::isinstance<py::int_>(item.first) && !py::isinstance<py::bool_>(item.first);
      const bool is_str = py::isinstance<py::str>(item.first);
      by_layer |= is_int;
      by_name |= is_str;
      if ((!is_int && !is_str) || (by_layer && by_name))
        raise(kvcore::Error::InvalidArgument,
              "state_tensors: key " + describe(item.first) +
                  ": keys are all tensor names (str) or all State layer indices (int)");
    }
    std::string listed;
    for (int l : state_layers) listed += (listed.empty() ? "" : ", ") + std::to_string(l);
    if (by_layer) {
      for (auto item : given) {
        const long long key = item.first.cast<long long>();
        bool is_state = false;
        for (int l : state_layers) is_state |= l == key;
        if (!is_state)
          raise(kvcore::Error::InvalidArgument, "state_tensors: key " + std::to_string(key) +
                                                    " names no State layer (the State layers: " +
                                                    (listed.empty() ? std::string("none") : listed) + ")");
      }
    }
    for (int l : state_layers) {
      py::object entry = by_layer ? given.attr("get")(py::int_(l)) : py::object(given);
      if (entry.is_none() || (!by_layer && given.empty()))
        raise(kvcore::Error::InvalidArgument,
              "state_tensors: layer " + std::to_string(l) +
                  " is a State layer and has no state tensors: pass state_tensors={name: (shape, dtype)}");
      if (!py::isinstance<py::dict>(entry))
        raise(kvcore::Error::InvalidArgument,
              "state_tensors: must be a dict of name -> (shape, dtype), or of State layer index -> such a dict, not " +
                  type_name(entry));
      out.parse_layer(l, py::reinterpret_borrow<py::dict>(entry));
    }
    return out;
  }

  /// Per layer: the bytes of one slot (0 for a layer that is not a State layer).
  kvcore::StateSlotBytes slot_bytes() const {
    return kvcore::StateSlotBytes{slot_bytes_.data(), static_cast<int>(slot_bytes_.size())};
  }
  std::size_t slot_bytes(int layer) const { return slot_bytes_[static_cast<std::size_t>(layer)]; }
  const std::vector<Tensor>& tensors(int layer) const { return layers_[static_cast<std::size_t>(layer)]; }

  /// `name` of State layer `layer`; InvalidArgument naming the layer's tensors otherwise.
  const Tensor& tensor(const char* what, int layer, const std::string& name) const {
    for (const Tensor& t : tensors(layer))
      if (t.name == name) return t;
    raise(kvcore::Error::InvalidArgument, std::string(what) + " of layer " + std::to_string(layer) + ": no tensor " +
                                              py::repr(py::str(name)).cast<std::string>() + " (the layer's tensors: " +
                                              names_of(layer) + ")");
  }

  /// Packs `states` (name -> array (n, *shape) of the tensor's dtype,
  /// C-contiguous; every tensor of the layer, no other) into n slot rows in
  /// `out`. Checks every entry before packing any (InvalidArgument naming
  /// the entry and the rule).
  void pack(const char* what, int layer, py::handle states, int n, std::vector<unsigned char>* out) const {
    const std::string at = std::string(what) + " of layer " + std::to_string(layer);
    if (!py::isinstance<py::dict>(states))
      raise(kvcore::Error::InvalidArgument,
            at + ": states must be a dict of tensor name -> array, not " + type_name(states));
    py::dict given = py::reinterpret_borrow<py::dict>(states);
    for (auto item : given)
      if (!py::isinstance<py::str>(item.first) || !has(layer, item.first.cast<std::string>()))
        (void)tensor(what, layer, py::str(item.first).cast<std::string>());  // raises naming the entry
    std::vector<const char*> data;
    for (const Tensor& t : tensors(layer)) {
      const std::string entry = at + ": states[" + py::repr(py::str(t.name)).cast<std::string>() + "]";
      if (!given.contains(t.name))
        raise(kvcore::Error::InvalidArgument, at + ": states lacks " + py::repr(py::str(t.name)).cast<std::string>() +
                                                  " (the layer's tensors: " + names_of(layer) + ")");
      py::handle a = given[py::str(t.name)];
      if (!py::isinstance<py::array>(a) || !py::reinterpret_borrow<py::array>(a).dtype().equal(t.dtype))
        raise(kvcore::Error::InvalidArgument,
              entry + " must be a numpy array of " + dtype_name(t.dtype) + ", not " +
                  (py::isinstance<py::array>(a) ? dtype_name(py::reinterpret_borrow<py::array>(a).dtype()) : type_name(a)));
      const py::array arr = py::reinterpret_borrow<py::array>(a);
      bool fits = arr.ndim() == static_cast<py::ssize_t>(t.shape.size()) + 1 && arr.shape(0) == n;
      for (std::size_t d = 0; fits && d < t.shape.size(); ++d) fits = arr.shape(static_cast<py::ssize_t>(d + 1)) == t.shape[d];
      if (!fits)
        raise(kvcore::Error::InvalidArgument, entry + ".shape = " + describe(arr.attr("shape")) + ": must be " +
                                                  shape_text("n", t.shape) + " with n = " + std::to_string(n) +
                                                  " (the states the step writes)");
      if (!(arr.flags() & py::array::c_style))
        raise(kvcore::Error::InvalidArgument, entry + ": must be C-contiguous (use numpy.ascontiguousarray)");
      data.push_back(static_cast<const char*>(arr.data()));
    }
    const std::size_t slot = slot_bytes(layer);
    out->assign(slot * static_cast<std::size_t>(n), 0);
    const std::vector<Tensor>& ts = tensors(layer);
    for (std::size_t i = 0; i < ts.size(); ++i)
      for (int j = 0; j < n; ++j)
        std::memcpy(out->data() + slot * static_cast<std::size_t>(j) + ts[i].offset,
                    data[i] + ts[i].bytes * static_cast<std::size_t>(j), ts[i].bytes);
  }

  /// name -> read-only array of the tensor's shape over a copy of one slot
  /// (`slot` null: zeros).
  py::dict unpack(int layer, const unsigned char* slot) const {
    const std::size_t bytes = slot_bytes(layer);
    PyObject* raw = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(bytes));
    if (raw == nullptr) throw py::error_already_set();
    const py::object owner = py::reinterpret_steal<py::object>(raw);
    unsigned char* copy = reinterpret_cast<unsigned char*>(PyBytes_AS_STRING(raw));
    if (slot == nullptr) std::memset(copy, 0, bytes);
    else std::memcpy(copy, slot, bytes);
    py::dict out;
    auto& api = py::detail::npy_api::get();
    for (const Tensor& t : tensors(layer)) {
      Py_INCREF(t.dtype.ptr());  // NewFromDescr steals it
      PyObject* arr = api.PyArray_NewFromDescr_(api.PyArray_Type_, t.dtype.ptr(), static_cast<int>(t.shape.size()),
                                                const_cast<Py_intptr_t*>(t.shape.data()), nullptr, copy + t.offset,
                                                0 /* read-only */, nullptr);
      if (arr == nullptr) throw py::error_already_set();
      py::object a = py::reinterpret_steal<py::object>(arr);
      if (api.PyArray_SetBaseObject_(arr, owner.inc_ref().ptr()) != 0) throw py::error_already_set();
      out[py::str(t.name)] = a;
    }
    return out;
  }

  /// State layer `layer`'s tensor names, in the order given, after `pool`
  /// checked it is one (InvalidArgument naming state_names otherwise).
  template <class Pool>
  py::list checked_names(const Pool& pool, int layer) const {
    throw_if_error(pool.check_state_layer(layer, "state_names"));
    return names(layer);
  }

  /// The layer's tensor names, in the order given.
  py::list names(int layer) const {
    py::list out;
    for (const Tensor& t : tensors(layer)) out.append(py::str(t.name));
    return out;
  }

 private:
  static std::string type_name(py::handle x) { return py::str(py::type::of(x).attr("__name__")).cast<std::string>(); }
  static std::string dtype_name(const py::dtype& d) { return py::str(d.attr("name")).cast<std::string>(); }
  static std::string shape_text(const char* first, const std::vector<Py_intptr_t>& shape) {
    std::string s = std::string("(") + first;
    for (Py_intptr_t d : shape) s += ", " + std::to_string(d);
    return s + ")";
  }
  bool has(int layer, const std::string& name) const {
    for (const Tensor& t : tensors(layer))
      if (t.name == name) return true;
    return false;
  }
  std::string names_of(int layer) const {
    std::string s;
    for (const Tensor& t : tensors(layer)) s += (s.empty() ? "" : ", ") + py::repr(py::str(t.name)).cast<std::string>();
    return s;
  }

  // A state tensor's dtype: a native numeric numpy dtype (float, int, uint,
  // bool) or "bfloat16" (ml_dtypes); InvalidArgument naming `entry` otherwise.
  static py::dtype state_dtype(const std::string& entry, py::handle given) {
    py::object spec = py::reinterpret_borrow<py::object>(given);
    if (py::isinstance<py::str>(spec) && spec.cast<std::string>() == "bfloat16") {
      try {
        spec = py::module_::import("ml_dtypes").attr("bfloat16");
      } catch (py::error_already_set&) {
        spec = py::none();
      }
    }
    py::dtype dt;
    bool ok = !spec.is_none();
    if (ok) {
      try {
        dt = py::dtype::from_args(spec);
      } catch (py::error_already_set&) {
        ok = false;
      }
    }
    if (ok) {
      const char kind = dt.kind();
      ok = dt.attr("isnative").cast<bool>() && dt.itemsize() >= 1 && dt.itemsize() <= 16 &&
           (kind == 'f' || kind == 'i' || kind == 'u' || kind == 'b' || dtype_name(dt) == "bfloat16");
    }
    if (!ok)
      raise(kvcore::Error::InvalidArgument,
            entry + ": dtype " + describe(given) +
                ": a state tensor takes a native numeric numpy dtype (float, int, uint, bool or \"bfloat16\")");
    return dt;
  }

  void parse_layer(int layer, const py::dict& entry) {
    std::vector<Tensor>& out = layers_[static_cast<std::size_t>(layer)];
    if (entry.empty())
      raise(kvcore::Error::InvalidArgument,
            "state_tensors: layer " + std::to_string(layer) + " has no tensors: a State layer needs at least one");
    std::uint64_t offset = 0;
    for (auto item : entry) {
      if (!py::isinstance<py::str>(item.first))
        raise(kvcore::Error::InvalidArgument,
              "state_tensors: key " + describe(item.first) +
                  ": keys are all tensor names (str) or all State layer indices (int)");
      Tensor t;
      t.name = item.first.cast<std::string>();
      if (t.name.empty())
        raise(kvcore::Error::InvalidArgument,
              "state_tensors: layer " + std::to_string(layer) + " has an empty tensor name: names must be non-empty");
      const std::string at = "state_tensors[" + describe(item.first) + "] of layer " + std::to_string(layer);
      const bool pair = (py::isinstance<py::tuple>(item.second) || py::isinstance<py::list>(item.second)) &&
                        py::len(item.second) == 2;
      if (!pair) raise(kvcore::Error::InvalidArgument, at + ": must be a (shape, dtype) pair, not " + describe(item.second));
      py::sequence value = py::reinterpret_borrow<py::sequence>(item.second);
      py::object shape = value[0];
      bool good_shape = py::isinstance<py::tuple>(shape) || py::isinstance<py::list>(shape);
      std::uint64_t elements = 1;
      bool fits = true;
      if (good_shape) {
        for (auto d : py::reinterpret_borrow<py::sequence>(shape)) {
          const bool is_int = py::isinstance<py::int_>(d) && !py::isinstance<py::bool_>(d);
          long long v = 0;
          int overflow = 0;
          if (is_int) v = PyLong_AsLongLongAndOverflow(d.ptr(), &overflow);
          if (!is_int || overflow != 0 || v < 1) {
            good_shape = false;
            break;
          }
          fits = fits && kvcore::PoolBytes::checked_mul(elements, static_cast<std::uint64_t>(v), &elements) &&
                 v <= PTRDIFF_MAX;
          t.shape.push_back(static_cast<Py_intptr_t>(fits ? v : 1));
        }
      }
      if (!good_shape)
        raise(kvcore::Error::InvalidArgument, at + ": shape " + describe(shape) + ": must be a tuple of ints >= 1");
      t.dtype = state_dtype(at, value[1]);
      std::uint64_t bytes = 0, start = (offset + kAlign - 1) / kAlign * kAlign, end = 0;
      fits = fits && kvcore::PoolBytes::checked_mul(elements, static_cast<std::uint64_t>(t.dtype.itemsize()), &bytes) &&
             kvcore::PoolBytes::checked_add(start, bytes, &end) &&
             kvcore::PoolBytes::checked_add(end, kAlign - 1, &offset);
      if (!fits)
        raise(kvcore::Error::InvalidArgument,
              at + ": shape " + describe(shape) + " of " + dtype_name(t.dtype) + ": the slot overflows the address space");
      t.offset = static_cast<std::size_t>(start);
      t.bytes = static_cast<std::size_t>(bytes);
      offset = end;
      out.push_back(std::move(t));
    }
    slot_bytes_[static_cast<std::size_t>(layer)] = static_cast<std::size_t>((offset + kAlign - 1) / kAlign * kAlign);
  }

  std::vector<std::vector<Tensor>> layers_;  // per layer: its tensors (none unless a State layer)
  std::vector<std::size_t> slot_bytes_;      // per layer: one slot's bytes (0 unless a State layer)
};

}  // namespace kvcore_py
