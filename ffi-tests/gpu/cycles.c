/* GPU leak check: loads a model on the GPU, runs 10 warm-up cycles (create, use, free a
   translator), prints "ready" and waits for a line on stdin, runs CYCLES cycles (default
   1000), prints "done" and waits again: gpu.sh reads the device's used memory at both
   pauses, while the process and its model are alive. Exit status 0 when every call
   succeeded.
   usage: cycles MODEL_DIR [CYCLES] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tolk.h"

/* Creates, uses and frees a translator `cycles` times; 0 when every call succeeded. */
static int run_cycles(const TolkModel *model, int cycles) {
    const char *text = "\xe4\xbd\xa0\xe5\xa5\xbd\xe3\x80\x82"; /* 你好。 */
    for (int i = 0; i < cycles; i++) {
        TolkTranslator *translator = NULL;
        TolkTextResult *result = NULL;
        if (tolk_translator_new(model, NULL, &translator) != TOLK_OK ||
            tolk_translate_text(translator, text, NULL, NULL, &result) != TOLK_OK) {
            fprintf(stderr, "cycles: cycle %d: %s\n", i, tolk_last_error());
            return 1;
        }
        tolk_text_result_free(result);
        tolk_translator_free(translator);
    }
    return 0;
}

/* Says `what` on stdout and waits for a line on stdin. */
static void pause_for(const char *what) {
    char line[16];
    printf("%s\n", what);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: cycles MODEL_DIR [CYCLES]\n");
        return 2;
    }
    int cycles = argc > 2 ? atoi(argv[2]) : 1000;
    TolkModelOptions mo = tolk_model_options_default();
    mo.device = "cuda";
    TolkModel *model = NULL;
    if (tolk_model_load_with_options(argv[1], &mo, &model) != TOLK_OK) {
        fprintf(stderr, "cycles: %s\n", tolk_last_error());
        return 1;
    }
    if (run_cycles(model, 10) != 0) return 1;
    pause_for("ready");
    if (run_cycles(model, cycles) != 0) return 1;
    pause_for("done");
    tolk_model_free(model);
    printf("%d translator cycles on %s\n", cycles, argv[1]);
    return 0;
}
