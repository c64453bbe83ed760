// parser.cpp — recursive-descent parser following jinja2/parser.py's grammar and precedence:
//   condexpr(a if c else b) < or < and < not < compare/in < +,- < ~ < *,/,//,% < ** < unary -,+
//   and then postfix (.attr, [i], calls) and filters/tests, which bind tighter than any binary
//   operator: "2 * 3 | string" is 2 * "3", "not x is defined" is not (x is defined).
#include <set>

#include "larder/core/status.h"
#include "larder/tokenizer/chat_template/ast.h"
#include "larder/tokenizer/chat_template/lexer.h"

namespace larder::chat_template {
namespace {

// Nesting bound for blocks and expressions. Every chained operation (a.b.c, x|f|g, a + b + c)
// counts as one level too, so the syntax tree — and the interpreter's recursion over it — stays
// shallow enough for any thread stack, whatever the input.
constexpr int kMaxNesting = 300;

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse_all() {
    Body b = subparse({});
    if (cur().type != Tok::kEof) fail(cur(), "unexpected token");
    return b;
  }

 private:
  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<Node*> macro_stack_;
  std::vector<std::pair<std::string, int>> open_blocks_;  // (tag, line) of unclosed blocks

  // Counts the links of a left-leaning chain built in a loop; released when the chain is done.
  struct ChainGuard {
    Parser* p;
    int n = 0;
    explicit ChainGuard(Parser* pp) : p(pp) {}
    void link() {
      ++n;
      if (++p->depth_ > kMaxNesting) p->fail(p->cur(), "template nesting too deep");
    }
    ~ChainGuard() { p->depth_ -= n; }
  };

  struct DepthGuard {
    Parser* p;
    explicit DepthGuard(Parser* pp) : p(pp) {
      if (++p->depth_ > kMaxNesting) p->fail(p->cur(), "template nesting too deep");
    }
    ~DepthGuard() { --p->depth_; }
  };

  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  void advance() { if (p_ + 1 < t_.size()) ++p_; }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof: return "end of template";
      case Tok::kVarEnd: return "end of print statement";
      case Tok::kBlockEnd: return "end of statement block";
      case Tok::kVarBegin: return "begin of print statement";
      case Tok::kBlockBegin: return "begin of statement block";
      case Tok::kData: return "template data";
      case Tok::kString: return "string";
      case Tok::kInt: case Tok::kFloat: return "number '" + t.text + "'";
      default: return "'" + t.text + "'";
    }
  }
  [[noreturn]] void fail(const Token& t, const std::string& msg) {
    throw_error(TemplateError::Kind::kSyntax, strfmt("%d:%d: %s", t.line, t.col, msg.c_str()), t.line);
  }
  [[noreturn]] void unsupported(const Token& t, const std::string& msg) {
    throw_error(TemplateError::Kind::kUnsupported, strfmt("%d:%d: %s", t.line, t.col, msg.c_str()), t.line);
  }

  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::kName && cur().text == n; }
  bool skip_op(const char* op) {
    if (is_op(op)) { advance(); return true; }
    return false;
  }
  bool skip_name(const char* n) {
    if (is_name(n)) { advance(); return true; }
    return false;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(cur(), strfmt("expected '%s', got %s", op, describe(cur()).c_str()));
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) fail(cur(), "expected a name, got " + describe(cur()));
    std::string n = cur().text;
    advance();
    return n;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd) fail(cur(), "expected end of statement block, got " + describe(cur()));
    advance();
  }

  // ------------------------------------------------------------------ statements

  // Parses until a {% name %} with name in `ends`; leaves the cursor on that name.
  Body subparse(const std::set<std::string>& ends) {
    DepthGuard g(this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (!ends.empty()) {
          std::string want;
          for (const auto& e : ends) want += (want.empty() ? "'" : " or '") + e + "'";
          std::string what = open_blocks_.empty() ? std::string("block")
                                                  : strfmt("'%s' opened at line %d", open_blocks_.back().first.c_str(), open_blocks_.back().second);
          fail(t, "unexpected end of template: " + what + " is not closed (looking for " + want + ")");
        }
        return body;
      }
      if (t.type == Tok::kData) {
        auto n = make_node(NodeKind::kData, t.line);
        n->str = t.text;
        body.push_back(n);
        advance();
      } else if (t.type == Tok::kVarBegin) {
        advance();
        auto n = make_node(NodeKind::kPrint, t.line);
        n->expr = parse_tuple(true, {}, false);
        if (cur().type != Tok::kVarEnd) fail(cur(), "expected end of print statement, got " + describe(cur()));
        advance();
        body.push_back(n);
      } else if (t.type == Tok::kBlockBegin) {
        advance();
        if (cur().type != Tok::kName) fail(cur(), "tag name expected");
        if (ends.count(cur().text)) return body;
        body.push_back(parse_statement());
      } else {
        fail(t, "unexpected " + describe(t));
      }
    }
  }

  // Parses a body ended by one of `ends`, consumes the end tag name; returns which.
  std::string body_until(Body& out, const std::set<std::string>& ends) {
    out = subparse(ends);
    std::string which = cur().text;
    advance();
    return which;
  }

  NodePtr parse_statement() {
    const Token& tag = cur();
    const std::string name = tag.text;
    int line = tag.line;
    if (name == "for") return parse_for();
    if (name == "if") return parse_if();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "call") return parse_call_block();
    if (name == "filter") return parse_filter_block();
    if (name == "with") return parse_with();
    if (name == "generation") {
      // Hugging Face's AssistantTracker extension: {% generation %} renders its body as is.
      advance();
      expect_block_end();
      auto n = make_node(NodeKind::kGeneration, line);
      open_blocks_.push_back({"generation", n->line});
      body_until(n->body, {"endgeneration"});
      open_blocks_.pop_back();
      expect_block_end();
      return n;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail(tag, "'" + name + "' outside of a loop");
      advance();
      expect_block_end();
      return make_node(name == "break" ? NodeKind::kBreak : NodeKind::kContinue, line);
    }
    static const std::set<std::string> kJinjaOnly = {"block", "extends", "include", "import", "from", "autoescape"};
    if (kJinjaOnly.count(name))
      unsupported(tag, "tag '" + name + "' is not supported by larder's chat-template engine (chat templates are single files)");
    fail(tag, "encountered unknown tag '" + name + "'");
  }

  std::vector<std::string> parse_target_names(const char* stop) {
    std::vector<std::string> names;
    bool paren = skip_op("(");
    while (true) {
      names.push_back(expect_name());
      if (!skip_op(",")) break;
      if (paren ? is_op(")") : is_name(stop)) break;
    }
    if (paren) expect_op(")");
    return names;
  }

  NodePtr parse_for() {
    auto n = make_node(NodeKind::kFor, cur().line);
    advance();
    n->names = parse_target_names("in");
    if (!skip_name("in")) fail(cur(), "expected 'in', got " + describe(cur()));
    n->expr = parse_tuple(false, {"recursive"}, false);
    if (skip_name("if")) n->test = parse_expression(true);
    if (is_name("recursive")) unsupported(cur(), "recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    open_blocks_.push_back({"for", n->line});
    std::string which = body_until(n->body, {"endfor", "else"});
    --loop_depth_;
    if (which == "else") {
      expect_block_end();
      body_until(n->else_body, {"endfor"});
    }
    open_blocks_.pop_back();
    expect_block_end();
    return n;
  }

  NodePtr parse_if() {
    auto n = make_node(NodeKind::kIf, cur().line);
    advance();
    open_blocks_.push_back({"if", n->line});
    while (true) {
      NodePtr cond = parse_tuple(false, {}, false);
      expect_block_end();
      Body b;
      std::string which = body_until(b, {"elif", "else", "endif"});
      n->branches.emplace_back(cond, std::move(b));
      if (which == "elif") continue;
      if (which == "else") {
        expect_block_end();
        body_until(n->else_body, {"endif"});
      }
      break;
    }
    open_blocks_.pop_back();
    expect_block_end();
    return n;
  }

  NodePtr parse_set() {
    int line = cur().line;
    advance();
    // Target: name, "ns.attr", or a tuple of names.
    std::vector<std::string> names;
    std::string ns_attr;
    names.push_back(expect_name());
    if (is_op(".") && peek().type == Tok::kName) {
      advance();
      ns_attr = expect_name();
    } else {
      while (skip_op(",")) names.push_back(expect_name());
    }
    if (skip_op("=")) {
      auto n = make_node(NodeKind::kSet, line);
      n->names = names;
      n->str = ns_attr;
      n->expr = parse_tuple(true, {}, false);
      expect_block_end();
      return n;
    }
    if (!ns_attr.empty() || names.size() != 1) fail(cur(), "expected '='");
    auto n = make_node(NodeKind::kSetBlock, line);
    n->names = names;
    while (skip_op("|")) n->args.push_back(parse_filter_head(nullptr));
    expect_block_end();
    open_blocks_.push_back({"set", n->line});
    body_until(n->body, {"endset"});
    open_blocks_.pop_back();
    expect_block_end();
    return n;
  }

  void parse_params(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (!n.kwargs.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string pname = expect_name();
      NodePtr def;
      if (skip_op("=")) def = parse_expression(true);
      n.kwargs.emplace_back(pname, def);
    }
    advance();
  }

  NodePtr parse_macro() {
    auto n = make_node(NodeKind::kMacro, cur().line);
    advance();
    n->str = expect_name();
    parse_params(*n);
    expect_block_end();
    int saved_loops = loop_depth_;
    loop_depth_ = 0;
    macro_stack_.push_back(n.get());
    open_blocks_.push_back({"macro", n->line});
    body_until(n->body, {"endmacro"});
    open_blocks_.pop_back();
    macro_stack_.pop_back();
    loop_depth_ = saved_loops;
    // {% endmacro name %} is allowed by jinja2.
    if (cur().type == Tok::kName) advance();
    expect_block_end();
    return n;
  }

  NodePtr parse_call_block() {
    auto n = make_node(NodeKind::kCallBlock, cur().line);
    advance();
    if (is_op("(")) parse_params(*n);
    n->expr = parse_expression(true);
    if (n->expr->kind != NodeKind::kCall) fail(cur(), "expected call");
    expect_block_end();
    int saved_loops = loop_depth_;
    loop_depth_ = 0;
    macro_stack_.push_back(n.get());
    open_blocks_.push_back({"call", n->line});
    body_until(n->body, {"endcall"});
    open_blocks_.pop_back();
    macro_stack_.pop_back();
    loop_depth_ = saved_loops;
    expect_block_end();
    return n;
  }

  NodePtr parse_filter_block() {
    auto n = make_node(NodeKind::kFilterBlock, cur().line);
    advance();
    n->args.push_back(parse_filter_head(nullptr));
    while (skip_op("|")) n->args.push_back(parse_filter_head(nullptr));
    expect_block_end();
    open_blocks_.push_back({"filter", n->line});
    body_until(n->body, {"endfilter"});
    open_blocks_.pop_back();
    expect_block_end();
    return n;
  }

  NodePtr parse_with() {
    auto n = make_node(NodeKind::kWith, cur().line);
    advance();
    while (cur().type != Tok::kBlockEnd) {
      if (!n->kwargs.empty()) expect_op(",");
      std::string name = expect_name();
      expect_op("=");
      n->kwargs.emplace_back(name, parse_expression(true));
    }
    expect_block_end();
    open_blocks_.push_back({"with", n->line});
    body_until(n->body, {"endwith"});
    open_blocks_.pop_back();
    expect_block_end();
    return n;
  }

  // ------------------------------------------------------------------ expressions

  bool is_tuple_end(const std::set<std::string>& extra) const {
    Tok ty = cur().type;
    if (ty == Tok::kVarEnd || ty == Tok::kBlockEnd || ty == Tok::kEof) return true;
    if (ty == Tok::kOp && cur().text == ")") return true;
    if (ty == Tok::kName && extra.count(cur().text)) return true;
    return false;
  }

  NodePtr parse_tuple(bool with_condexpr, const std::set<std::string>& extra, bool explicit_parens) {
    int line = cur().line;
    std::vector<NodePtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return items[0];
      if (!explicit_parens) fail(cur(), "expected an expression, got " + describe(cur()));
    }
    auto n = make_node(NodeKind::kTuple, line);
    n->args = std::move(items);
    return n;
  }

  NodePtr parse_expression(bool with_condexpr) {
    DepthGuard g(this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  NodePtr parse_condexpr() {
    ChainGuard chain(this);
    NodePtr e1 = parse_or();
    while (is_name("if")) {
      chain.link();
      int line = cur().line;
      advance();
      NodePtr cond = parse_or();
      NodePtr e3;
      if (skip_name("else")) e3 = parse_condexpr();
      auto n = make_node(NodeKind::kCondExpr, line);
      n->test = cond;
      n->args = {e1, e3};
      e1 = n;
    }
    return e1;
  }

  NodePtr parse_or() {
    ChainGuard chain(this);
    NodePtr l = parse_and();
    while (is_name("or")) {
      chain.link();
      auto n = make_node(NodeKind::kOr, cur().line);
      advance();
      n->args = {l, parse_and()};
      l = n;
    }
    return l;
  }
  NodePtr parse_and() {
    ChainGuard chain(this);
    NodePtr l = parse_not();
    while (is_name("and")) {
      chain.link();
      auto n = make_node(NodeKind::kAnd, cur().line);
      advance();
      n->args = {l, parse_not()};
      l = n;
    }
    return l;
  }
  NodePtr parse_not() {
    if (is_name("not")) {
      DepthGuard g(this);
      auto n = make_node(NodeKind::kNot, cur().line);
      advance();
      n->args = {parse_not()};
      return n;
    }
    return parse_compare();
  }
  NodePtr parse_compare() {
    int line = cur().line;
    NodePtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<NodePtr> rest;
    while (true) {
      if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                     cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        ops.push_back(cur().text);
        advance();
        rest.push_back(parse_math1());
      } else if (is_name("in")) {
        advance();
        ops.push_back("in");
        rest.push_back(parse_math1());
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        advance();
        advance();
        ops.push_back("notin");
        rest.push_back(parse_math1());
      } else {
        break;
      }
    }
    if (ops.empty()) return first;
    auto n = make_node(NodeKind::kCompare, line);
    n->args.push_back(first);
    for (auto& r : rest) n->args.push_back(r);
    n->ops = std::move(ops);
    return n;
  }
  NodePtr binary(const std::string& op, NodePtr l, NodePtr r, int line) {
    auto n = make_node(NodeKind::kBinary, line);
    n->str = op;
    n->args = {std::move(l), std::move(r)};
    return n;
  }
  NodePtr parse_math1() {
    ChainGuard chain(this);
    NodePtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      chain.link();
      std::string op = cur().text;
      int line = cur().line;
      advance();
      l = binary(op, l, parse_concat(), line);
    }
    return l;
  }
  NodePtr parse_concat() {
    int line = cur().line;
    std::vector<NodePtr> args{parse_math2()};
    while (skip_op("~")) args.push_back(parse_math2());
    if (args.size() == 1) return args[0];
    auto n = make_node(NodeKind::kConcat, line);
    n->args = std::move(args);
    return n;
  }
  NodePtr parse_math2() {
    ChainGuard chain(this);
    NodePtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      chain.link();
      std::string op = cur().text;
      int line = cur().line;
      advance();
      l = binary(op, l, parse_pow(), line);
    }
    return l;
  }
  NodePtr parse_pow() {
    ChainGuard chain(this);
    NodePtr l = parse_unary(true);
    while (is_op("**")) {
      chain.link();
      int line = cur().line;
      advance();
      l = binary("**", l, parse_unary(true), line);
    }
    return l;
  }
  NodePtr parse_unary(bool with_filter) {
    DepthGuard g(this);
    NodePtr node;
    int line = cur().line;
    if (is_op("-") || is_op("+")) {
      bool neg = cur().text == "-";
      advance();
      node = make_node(neg ? NodeKind::kNeg : NodeKind::kPos, line);
      node->args = {parse_unary(false)};
    } else {
      node = parse_primary();
    }
    node = parse_postfix(node);
    if (with_filter) node = parse_filter_expr(node);
    return node;
  }

  NodePtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    switch (t.type) {
      case Tok::kName: {
        std::string n = t.text;
        advance();
        if (n == "true" || n == "True") return constant(Value::boolean(true), line);
        if (n == "false" || n == "False") return constant(Value::boolean(false), line);
        if (n == "none" || n == "None") return constant(Value::none(), line);
        auto node = make_node(NodeKind::kName, line);
        node->str = n;
        if (!macro_stack_.empty()) {
          if (n == "caller") macro_stack_.back()->uses_caller = true;
          if (n == "varargs") macro_stack_.back()->uses_varargs = true;
          if (n == "kwargs") macro_stack_.back()->uses_kwargs = true;
        }
        return node;
      }
      case Tok::kString: {
        std::string s;
        while (cur().type == Tok::kString) {  // adjacent literals concatenate
          s += cur().text;
          advance();
        }
        return constant(Value::string(std::move(s)), line);
      }
      case Tok::kInt: {
        int64_t v = t.ival;
        advance();
        return constant(Value::integer(v), line);
      }
      case Tok::kFloat: {
        double v = t.fval;
        advance();
        return constant(Value::floating(v), line);
      }
      case Tok::kOp: {
        if (t.text == "(") {
          advance();
          NodePtr n = parse_tuple(true, {}, true);
          expect_op(")");
          return n;
        }
        if (t.text == "[") {
          advance();
          auto n = make_node(NodeKind::kList, line);
          while (!is_op("]")) {
            if (!n->args.empty()) expect_op(",");
            if (is_op("]")) break;
            n->args.push_back(parse_expression(true));
          }
          advance();
          return n;
        }
        if (t.text == "{") {
          advance();
          auto n = make_node(NodeKind::kDict, line);
          while (!is_op("}")) {
            if (!n->args.empty()) expect_op(",");
            if (is_op("}")) break;
            n->args.push_back(parse_expression(true));
            expect_op(":");
            n->args.push_back(parse_expression(true));
          }
          advance();
          return n;
        }
        break;
      }
      default:
        break;
    }
    fail(t, "unexpected " + describe(t));
  }

  NodePtr constant(Value v, int line) {
    auto n = make_node(NodeKind::kConst, line);
    n->value = std::move(v);
    return n;
  }

  NodePtr parse_postfix(NodePtr node) {
    ChainGuard chain(this);
    while (true) {
      int line = cur().line;
      if (is_op(".") || is_op("[") || is_op("(")) chain.link();
      if (is_op(".")) {
        advance();
        if (cur().type == Tok::kName) {
          auto n = make_node(NodeKind::kGetAttr, line);
          n->str = cur().text;
          n->expr = node;
          advance();
          node = n;
        } else if (cur().type == Tok::kInt) {
          auto n = make_node(NodeKind::kGetItem, line);
          n->expr = node;
          n->args = {constant(Value::integer(cur().ival), line)};
          advance();
          node = n;
        } else {
          fail(cur(), "expected name or number after '.'");
        }
      } else if (is_op("[")) {
        advance();
        std::vector<NodePtr> idx;
        while (!is_op("]")) {
          if (!idx.empty()) expect_op(",");
          if (is_op("]")) break;
          idx.push_back(parse_subscribed());
        }
        advance();
        if (idx.empty()) fail(cur(), "expected subscript expression");
        NodePtr key = idx[0];
        if (idx.size() > 1) {
          for (const auto& k : idx)
            if (k->kind == NodeKind::kSlice) unsupported(cur(), "multi-dimensional slicing is not supported");
          key = make_node(NodeKind::kTuple, line);
          key->args = idx;
        }
        if (key->kind == NodeKind::kSlice) {
          key->expr = node;
          node = key;
        } else {
          auto n = make_node(NodeKind::kGetItem, line);
          n->expr = node;
          n->args = {key};
          node = n;
        }
      } else if (is_op("(")) {
        node = parse_call(node);
      } else {
        return node;
      }
    }
  }

  NodePtr parse_subscribed() {
    int line = cur().line;
    std::vector<NodePtr> parts;
    if (is_op(":")) {
      advance();
      parts.push_back(nullptr);
    } else {
      NodePtr n = parse_expression(true);
      if (!is_op(":")) return n;
      advance();
      parts.push_back(n);
    }
    if (is_op(":")) parts.push_back(nullptr);
    else if (!is_op("]") && !is_op(",")) parts.push_back(parse_expression(true));
    else parts.push_back(nullptr);
    if (is_op(":")) {
      advance();
      if (!is_op("]") && !is_op(",")) parts.push_back(parse_expression(true));
      else parts.push_back(nullptr);
    } else {
      parts.push_back(nullptr);
    }
    auto s = make_node(NodeKind::kSlice, line);
    s->args = parts;
    return s;
  }

  void parse_call_args(Node& n) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*")) {
        advance();
        n.dyn_args = parse_expression(true);
      } else if (is_op("**")) {
        advance();
        n.dyn_kwargs = parse_expression(true);
      } else if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        std::string k = cur().text;
        advance();
        advance();
        n.kwargs.emplace_back(k, parse_expression(true));
      } else {
        if (!n.kwargs.empty() || n.dyn_args || n.dyn_kwargs) fail(cur(), "invalid syntax for function call expression");
        n.args.push_back(parse_expression(true));
      }
    }
    advance();
  }

  NodePtr parse_call(NodePtr callee) {
    auto n = make_node(NodeKind::kCall, cur().line);
    n->expr = callee;
    parse_call_args(*n);
    return n;
  }

  // "|name(.name)*[(args)]" after the '|' was consumed; operand may be null (filter blocks).
  NodePtr parse_filter_head(NodePtr operand) {
    auto n = make_node(NodeKind::kFilter, cur().line);
    n->str = expect_name();
    while (is_op(".") && peek().type == Tok::kName) {
      advance();
      n->str += "." + expect_name();
    }
    n->expr = operand;
    if (is_op("(")) parse_call_args(*n);
    return n;
  }

  NodePtr parse_filter_expr(NodePtr node) {
    ChainGuard chain(this);
    while (true) {
      if (is_op("|") || is_name("is") || is_op("(")) chain.link();
      if (is_op("|")) {
        advance();
        node = parse_filter_head(node);
      } else if (is_name("is")) {
        node = parse_test(node);
      } else if (is_op("(")) {
        node = parse_call(node);
      } else {
        return node;
      }
    }
  }

  NodePtr parse_test(NodePtr node) {
    auto n = make_node(NodeKind::kTest, cur().line);
    advance();  // 'is'
    if (skip_name("not")) n->negated = true;
    n->str = expect_name();
    while (is_op(".") && peek().type == Tok::kName) {
      advance();
      n->str += "." + expect_name();
    }
    n->expr = node;
    const Token& t = cur();
    if (is_op("(")) {
      parse_call_args(*n);
    } else if ((t.type == Tok::kName || t.type == Tok::kString || t.type == Tok::kInt || t.type == Tok::kFloat ||
                (t.type == Tok::kOp && (t.text == "(" || t.text == "[" || t.text == "{"))) &&
               !(t.type == Tok::kName && (t.text == "else" || t.text == "or" || t.text == "and"))) {
      if (is_name("is")) fail(t, "You cannot chain multiple tests with is");
      NodePtr arg = parse_primary();
      arg = parse_postfix(arg);
      n->args.push_back(arg);
    }
    return n;
  }
};

}  // namespace

Body parse_template(std::string_view source, const std::string& name) {
  (void)name;
  Parser p(lex(source));
  return p.parse_all();
}

}  // namespace larder::chat_template
