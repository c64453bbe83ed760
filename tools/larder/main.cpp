// larder — command-line entry point. Verbs live in tools/larder/cmd_*.cpp.
#include <cstdio>
int main() { std::puts("larder"); return 0; }
