#include "text_search.hpp"

#include <regex>

namespace crewd::test {

std::optional<std::vector<std::string>> search(const std::string& text,
                                               const std::string& pattern) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(pattern))) return std::nullopt;
  std::vector<std::string> groups;
  groups.reserve(m.size());
  for (const auto& g : m) groups.push_back(g.str());
  return groups;
}

}  // namespace crewd::test
