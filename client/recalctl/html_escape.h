// Text into HTML and SVG. Layer names come from uploaded models, so whoever uploaded one
// chooses them: every string from a report goes through here before it reaches a page.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace recal::ctl {

// `text` safe as element content and as a quoted attribute value: & < > " ' become
// entities. Control characters other than tab and newline (not allowed in HTML text)
// become U+FFFD.
std::string HtmlEscape(absl::string_view text);

}  // namespace recal::ctl
