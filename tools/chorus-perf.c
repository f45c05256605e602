int main(void) { return 1; } /* placeholder: to be written */
