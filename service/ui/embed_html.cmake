# Writes the file IN as a C++ raw string literal into OUT (console_html()).
# The delimiter is one console.html must not contain.
file(READ ${IN} html)
string(FIND "${html}" ")crewd_html\"" found)
if(NOT found EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw string's delimiter")
endif()
file(WRITE ${OUT}.tmp "// Generated from console.html by embed_html.cmake; edit console.html.\n"
  "#include \"ui/console_page.hpp\"\n"
  "namespace crewd::ui {\n"
  "std::string_view console_html() noexcept {\n"
  "  static constexpr std::string_view kHtml = R\"crewd_html(${html})crewd_html\";\n"
  "  return kHtml;\n"
  "}\n"
  "}  // namespace crewd::ui\n")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
