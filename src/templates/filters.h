// templates/filters.h — Jinja's filters and tests (filters.cc): applied by name, and the names the
// parser accepts. Internal to src/templates.
#pragma once
#include <string>

#include "templates/value.h"

namespace onyx::templates {

bool is_filter(const std::string& name);
bool is_test(const std::string& name);
Value apply_filter(const std::string& name, const Value& v, Args& a, Kwargs& kw);
bool apply_test(const std::string& name, const Value& v, const Args& a);

}  // namespace onyx::templates
