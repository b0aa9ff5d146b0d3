// EBNF front end, GBNF dialect (llama.cpp's grammar format):
//
//   root   ::= object
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"      # comments run to the end of the line
//   pair   ::= [a-z]+ ws ":" ws ( [0-9]{1,3} | "null" )
//   ws     ::= [ \t\n]*
//
// Rules (names of letters, digits, '-' and '_'), alternation '|', grouping '( )', repetition * + ? {m} {m,}
// {m,n} {,n}, strings "..." with escapes (\n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH), character classes [...]
// with ranges and negation [^...] over Unicode code points, '.' (any character). A rule may continue over
// several lines; it ends where the next `name ::=` starts. Left-recursive rules are rejected by the compiler.
#pragma once

#include <string_view>

#include "deepinfer/structured/grammar.h"

namespace deepinfer::structured {

// Throws deepinfer::Error(InvalidArgument) with line:column for syntax errors and undefined rules.
Grammar grammar_from_ebnf(std::string_view text, std::string_view root_rule = "root");

}  // namespace deepinfer::structured
