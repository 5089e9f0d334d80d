// _pulsar_nack_ids: reads (ledger id, entry id, batch index, batch size) of pulsar-client's messages in one
// native call, for one message or a whole list (batch_receive). It shares pybind11's internals with
// pulsar-client's _pulsar module, so it must be built with the pybind11 minor version pulsar-client was built
// with (3.0.x: internals v11 for pulsar-client 3.13) and link against pulsar-client's bundled libpulsar.
#include <pybind11/pybind11.h>

#include <string>

#include "pulsar_abi.h"

namespace py = pybind11;

namespace {

PyObject* g_message_type = nullptr;  // _pulsar.Message (a pybind11 type registered by _pulsar)
PyObject* g_inner_name = nullptr;    // "_message": where pulsar.Message keeps its _pulsar.Message

// Errors are raised as Python errors set here: a C++ exception type thrown from this module is not always
// recognised by the exception translator pulsar-client's _pulsar registered first in the shared internals
// (a py::type_error thrown here came out as RuntimeError).
[[noreturn]] void fail(PyObject* obj) {
    PyErr_Format(PyExc_TypeError, "expected a pulsar.Message or _pulsar.Message, got %s", Py_TYPE(obj)->tp_name);
    throw py::error_already_set();
}

// pybind11's general route: its type lookup in the shared internals (subclasses, other holders).
const pulsar::Message& generic_message(PyObject* obj) {
    py::detail::make_caster<const pulsar::Message&> caster;
    if (!caster.load(py::handle(obj), false)) fail(obj);
    return py::detail::cast_op<const pulsar::Message&>(caster);
}

PyObject* ids_tuple(const pulsar::Message& message) {
    const pulsar::MessageId& id = message.getMessageId();
    PyObject* tuple = PyTuple_New(4);
    if (tuple == nullptr) throw py::error_already_set();
    PyObject* items[4] = {PyLong_FromLongLong(id.ledgerId()), PyLong_FromLongLong(id.entryId()),
                          PyLong_FromLong(id.batchIndex()), PyLong_FromLong(id.batchSize())};
    for (int i = 0; i < 4; ++i) {
        if (items[i] == nullptr) {
            Py_DECREF(tuple);
            for (int j = i + 1; j < 4; ++j) Py_XDECREF(items[j]);
            throw py::error_already_set();
        }
        PyTuple_SET_ITEM(tuple, i, items[i]);
    }
    return tuple;
}

// The ids tuple of `obj`, a _pulsar.Message or a pulsar.Message wrapping one (in its `_message`). With
// `fast`, an exact _pulsar.Message skips pybind11's type lookup: an instance of a pybind11 type whose value is
// held in the simple layout has its C++ pointer first (pybind11's `instance` struct, part of the ABI its
// internals version fixes). Without it, every message goes through pybind11's lookup in the shared internals.
PyObject* ids_of(PyObject* obj, bool fast) {
    py::object inner;  // owns the unwrapped _pulsar.Message while it is read
    if (Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(g_message_type)) {
        PyObject* attr = PyObject_GetAttr(obj, g_inner_name);
        if (attr == nullptr) {
            PyErr_Clear();
            fail(obj);
        }
        inner = py::reinterpret_steal<py::object>(attr);
        obj = attr;
    }
    if (fast && Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(g_message_type)) {
        auto* inst = reinterpret_cast<py::detail::instance*>(obj);
        if (inst->simple_layout && inst->simple_value_holder[0] != nullptr) {
            return ids_tuple(*static_cast<const pulsar::Message*>(inst->simple_value_holder[0]));
        }
    }
    return ids_tuple(generic_message(obj));
}

// ids(message) -> (ledger, entry, batch index, batch size). O(1).
py::object ids(py::handle message) { return py::reinterpret_steal<py::object>(ids_of(message.ptr(), true)); }

// ids_all(messages) -> [ids(m) for m in messages]. O(len(messages)), one Python call.
py::object ids_all(py::handle messages) {
    py::object seq =
        py::reinterpret_steal<py::object>(PySequence_Fast(messages.ptr(), "messages: expected a sequence"));
    if (!seq) throw py::error_already_set();
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
    PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
    py::object out = py::reinterpret_steal<py::object>(PyList_New(n));
    if (!out) throw py::error_already_set();
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyList_SET_ITEM(out.ptr(), i, ids_of(items[i], true));
    }
    return out;
}

// generic_ids(message): the same through pybind11's own type lookup on every call (no exact-type fast
// path), to measure what sharing the internals costs without reading pybind11's instance layout.
py::object generic_ids(py::handle message) {
    return py::reinterpret_steal<py::object>(ids_of(message.ptr(), false));
}

// The same two entry points as plain METH_O functions: a pybind11-dispatched call costs ~0.2 µs more (its
// argument loader and overload machinery), which is the whole budget on the one-message-per-call path.
template <PyObject* (*F)(PyObject*)>
PyObject* raw(PyObject*, PyObject* arg) {
    try {
        return F(arg);
    } catch (py::error_already_set& error) {
        error.restore();
    } catch (const std::exception& error) {
        PyErr_SetString(PyExc_RuntimeError, error.what());
    }
    return nullptr;
}

PyObject* ids_raw(PyObject* message) { return ids_of(message, true); }
PyObject* ids_all_raw(PyObject* messages) { return ids_all(py::handle(messages)).release().ptr(); }

PyMethodDef raw_methods[] = {
    {"ids", raw<ids_raw>, METH_O, "ids(message) -> (ledger id, entry id, batch index, batch size). O(1)."},
    {"ids_all", raw<ids_all_raw>, METH_O, "ids_all(messages) -> [ids(m) for m in messages], in one call."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

#ifndef PULSAR_CLIENT_VERSION
#    error "PULSAR_CLIENT_VERSION (the pulsar-client version built against) must be defined (setup.py does)"
#endif

PYBIND11_MODULE(_pulsar_nack_ids, m) {
    // The C++ declarations in pulsar_abi.h were checked against the libpulsar of one pulsar-client: refuse
    // any other (its libpulsar file name carries a hash, so the link would fail anyway; this says why).
    std::string running = py::str(py::module_::import("pulsar").attr("__version__"));
    if (running != PULSAR_CLIENT_VERSION) {
        throw py::import_error("_pulsar_nack_ids: built for pulsar-client " + std::string(PULSAR_CLIENT_VERSION) +
                               ", running with " + running);
    }
    py::object message_type = py::module_::import("_pulsar").attr("Message");
    // _pulsar.Message must be the type pybind11 knows as pulsar::Message in *our* view of the internals:
    // if pulsar-client was built with another pybind11 internals version, the lookup finds nothing.
    py::detail::type_info* info = py::detail::get_type_info(typeid(pulsar::Message));
    if (info == nullptr || reinterpret_cast<PyObject*>(info->type) != message_type.ptr()) {
        throw py::import_error(
            "_pulsar_nack_ids: pulsar-client's pybind11 types are not visible (internals key " +
            std::string(PYBIND11_INTERNALS_ID) + "): built for another pulsar-client");
    }
    g_message_type = message_type.release().ptr();
    g_inner_name = PyUnicode_InternFromString("_message");
    m.attr("INTERNALS_ID") = PYBIND11_INTERNALS_ID;
    m.attr("PYBIND11_VERSION") = py::make_tuple(PYBIND11_VERSION_MAJOR, PYBIND11_VERSION_MINOR, PYBIND11_VERSION_PATCH);
    for (PyMethodDef* def = raw_methods; def->ml_name != nullptr; ++def) {
        m.attr(def->ml_name) = py::reinterpret_steal<py::object>(PyCFunction_NewEx(def, nullptr, m.ptr()));
    }
    m.def("pybind_ids", &ids, "ids() through a pybind11-dispatched call (for measuring)");
    m.def("generic_ids", &generic_ids, "ids() through pybind11's type lookup only (for measuring)");
}
