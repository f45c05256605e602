/*
 * module.cpp - chorus_torch._C, the Python face of ProcessGroupChorus:
 * the class (a torch.distributed ProcessGroup) and the library's version.
 * chorus_torch/__init__.py registers backend "chorus" with it.
 */
#include <torch/csrc/utils/pybind.h>

#include "ProcessGroupChorus.hpp"

namespace py = pybind11;
using chorus_torch::ProcessGroupChorus;

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch.distributed backend \"chorus\" (libchorus)";
  /* the base classes (ProcessGroup, Store) are registered there */
  py::module::import("torch.distributed");

  py::class_<ProcessGroupChorus, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupChorus>>(
      m, "ProcessGroupChorus",
      "A torch.distributed process group over Chorus; made by init_process_group(\"chorus\")")
      .def(py::init([](c10d::Store *store, int rank, int size, double timeout_s) {
             if (!store)
               throw py::value_error("chorus: store is None");
             auto s = c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(store);
             auto ms = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
             /* rendezvous and connection are collective: other Python
              * threads go on meanwhile */
             py::gil_scoped_release nogil;
             return c10::make_intrusive<ProcessGroupChorus>(s, rank, size, ms);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"),
           "Rendezvous through store (collective over the size ranks); timeout_s becomes the "
           "communicator's CHORUS_TIMEOUT")
      .def_property_readonly("provider", &ProcessGroupChorus::provider,
                             "Chorus's transport for this group (\"shm\", \"shm+sock\", ...)");

  m.def(
      "version", [] { return std::string(chorus_version()); }, "libchorus's version");
}
