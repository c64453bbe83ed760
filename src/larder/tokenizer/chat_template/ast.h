// ast.h — syntax tree of a parsed template (one node type, fields used per kind).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "larder/tokenizer/chat_template/value.h"

namespace larder::chat_template {

enum class NodeKind {
  // expressions
  kConst, kName, kGetAttr, kGetItem, kSlice, kCall, kFilter, kTest, kNeg, kPos, kNot, kBinary,
  kCompare, kAnd, kOr, kCondExpr, kList, kTuple, kDict, kConcat,
  // statements
  kData, kPrint, kIf, kFor, kSet, kSetBlock, kMacro, kCallBlock, kFilterBlock, kWith, kBreak,
  kContinue, kGeneration,
};

struct Node;
using NodePtr = std::shared_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  NodeKind kind;
  int line = 0;
  std::string str;                                      // name, attribute, filter/test, operator, data
  Value value;                                          // kConst
  std::vector<NodePtr> args;                            // operands, positional args, items (dict: k,v,k,v)
  std::vector<std::pair<std::string, NodePtr>> kwargs;  // keyword args; macro params (default or null)
  NodePtr dyn_args, dyn_kwargs;                         // *args, **kwargs in a call
  std::vector<std::string> ops;                         // kCompare operators
  bool negated = false;                                 // kTest: "is not"
  NodePtr expr, test, target;                           // generic slots (see parser)
  Body body, else_body;
  std::vector<std::pair<NodePtr, Body>> branches;       // kIf: (condition, body) incl. elifs
  std::vector<std::string> names;                       // for/set targets, macro-level names
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;  // macros
};

inline NodePtr make_node(NodeKind k, int line) {
  auto n = std::make_shared<Node>();
  n->kind = k;
  n->line = line;
  return n;
}

// Throws TemplateError (kSyntax / kUnsupported) naming the template line.
Body parse_template(std::string_view source, const std::string& name);

}  // namespace larder::chat_template
