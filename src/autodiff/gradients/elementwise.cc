// elementwise.cc — gradient rules for elementwise ops. Each rule is a few emitted nodes; the
// builder (GradContext::set) undoes broadcasting by summing over broadcast axes.
#include "autodiff/gradient.h"

namespace onyx::autodiff {

void register_elementwise_grads(GradRegistry& r) {
  // y = a + b: da = dy, db = dy
  r.add("", "Add", [](GradContext& c) {
    c.set(0, c.GO(0));
    c.set(1, c.GO(0));
  });
  // y = a - b: da = dy, db = -dy
  r.add("", "Sub", [](GradContext& c) {
    c.set(0, c.GO(0));
    if (c.needs(1)) c.set(1, c.emit1("Neg", {c.GO(0)}));
  });
  // y = a * b: da = dy * b, db = dy * a
  r.add("", "Mul", [](GradContext& c) {
    if (c.needs(0)) c.set(0, c.emit1("Mul", {c.GO(0), c.I(1)}));
    if (c.needs(1)) c.set(1, c.emit1("Mul", {c.GO(0), c.I(0)}));
  });
  // y = a / b: da = dy / b, db = -dy * y / b
  r.add("", "Div", [](GradContext& c) {
    if (c.needs(0)) c.set(0, c.emit1("Div", {c.GO(0), c.I(1)}));
    if (c.needs(1)) {
      std::string t = c.emit1("Mul", {c.GO(0), c.O(0)});
      c.set(1, c.emit1("Neg", {c.emit1("Div", {t, c.I(1)})}));
    }
  });
  r.add("", "Neg", [](GradContext& c) { c.set(0, c.emit1("Neg", {c.GO(0)})); });
  r.add("", "Identity", [](GradContext& c) { c.set(0, c.GO(0)); });
  // Sum(x0, x1, ...): every input gets dy (reduced to its shape)
  r.add("", "Sum", [](GradContext& c) {
    for (int i = 0; i < c.num_inputs(); i++) c.set(i, c.GO(0));
  });
}

}  // namespace onyx::autodiff
