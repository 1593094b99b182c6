// shape.cc — gradient rules of this family (being written).
#include "autodiff/gradient.h"
namespace onyx::autodiff {
void register_shape_grads(GradRegistry&) {}
}  // namespace onyx::autodiff
