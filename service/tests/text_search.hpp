// Regular-expression search for crewd's tests, compiled once
// (text_search.cpp) instead of in every test file: std::regex's templates
// took about 4 s of g++'s time in each file that used them.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace crewd::test {

// The first match of `pattern` (ECMAScript syntax) in `text`: the whole
// match, then each capture group, in order (an unmatched group as an empty
// string); nullopt when nothing matches. Throws std::regex_error for a bad
// pattern.
std::optional<std::vector<std::string>> search(const std::string& text, const std::string& pattern);

}  // namespace crewd::test
