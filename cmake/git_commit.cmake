# Writes OUT: `#define TRYBOX_GIT_COMMIT "<short commit>"` of the checkout at SRC ("" when it
# is not a git checkout or git is missing). Run at every build; OUT changes only when the
# commit does, so only src/util/version.cc is rebuilt then.
execute_process(COMMAND git -C "${SRC}" rev-parse --short=12 HEAD
  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  set(commit "")
endif()
file(WRITE "${OUT}.tmp" "#define TRYBOX_GIT_COMMIT \"${commit}\"\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
